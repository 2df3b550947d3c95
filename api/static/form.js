// The request form, generated from the PlanRequest schema in /openapi.json: every field of
// the request gets an input (a field added to the models appears without touching this
// file), with its description, default and limits; a request can also be pasted as JSON.
// An error the server answers is shown at the field it belongs to, not only in a banner.
"use strict";

// Starting values (a GPT-3 13B run on one node); every other field starts at its default.
const FORM_PRESET = {
  model: { name: "gpt3-13b", num_layers: 40, hidden_size: 5120, num_attention_heads: 40, seq_length: 2048, vocab_size: 51200 },
  cluster: { gpu: "a100-sxm-80g", num_nodes: 1, gpus_per_node: 8 },
  training: { global_batch_size: 32 },
  search: { schedules: ["1f1b", "bpipe", "v-half", "v-zb"] },
};
let formFields = []; // [{path, group, name, schema, required, kind}] of the form on the page
// What the person typed is kept for the tab (sessionStorage), so the back button, a look at
// the hardware page or a reload do not throw it away; "Start again" clears it.
const FORM_DRAFT = "stagewright.plan-form";
// A number as a person writes one: 8, -2, 0.5, .5, 1e3.
const NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

function resolveRef(schemas, s) { return s && s.$ref ? schemas[s.$ref.split("/").pop()] : s; }
// A nullable field's schema without its null branch, and whether it may be null.
function unwrapNullable(s) {
  if (s.anyOf) {
    const other = s.anyOf.filter((b) => b.type !== "null");
    if (other.length === 1) return [{ ...s, ...other[0], anyOf: undefined }, s.anyOf.length > other.length];
  }
  return [s, false];
}
function fieldKind(s) {
  if (s.type === "boolean") return "bool";
  if (s.type === "integer" || s.type === "number") return "number";
  if (s.type === "array" && s.items && s.items.enum) return "choices";
  if (s.type === "array") return "list";
  if (s.enum) return "select";
  return "text";
}
function fieldLabel(name) { return name.replace(/_/g, " "); }
const plainText = (text) => (text || "").replace(/``?([^`]+)``?/g, "$1"); // docstrings' ``code``
function limitsText(s) {
  const parts = [];
  if (s.minimum !== undefined) parts.push(`≥ ${s.minimum}`);
  if (s.exclusiveMinimum !== undefined) parts.push(`> ${s.exclusiveMinimum}`);
  if (s.maximum !== undefined) parts.push(`≤ ${s.maximum}`);
  return parts.join(", ");
}

async function showForm() {
  const live = pageTicket();
  const [hw, doc] = await Promise.all([api("/v1/hardware"), api("/openapi.json")]);
  if (!live()) return;
  if (doc.status !== 200) return app.replaceChildren(el("div", { class: "banner bad" }, problemText(doc.body)));
  const gpus = hw.status === 200 ? (hw.body.items || hw.body).map((h) => h.name) : [];
  const schemas = doc.body.components.schemas;
  const root = schemas.PlanRequest;
  formFields = [];
  const sets = Object.entries(root.properties).map(([group, ref]) => {
    const schema = resolveRef(schemas, ref);
    const required = new Set(schema.required || []);
    const rows = Object.entries(schema.properties).map(([name, raw]) => {
      const [s, nullable] = unwrapNullable(resolveRef(schemas, raw));
      const path = `${group}.${name}`;
      const kind = path === "cluster.gpu" && gpus.length ? "select" : fieldKind(s);
      const choices = path === "cluster.gpu" && gpus.length ? gpus : s.enum || (s.items && s.items.enum) || [];
      formFields.push({ path, group, name, schema: s, required: required.has(name), nullable, kind });
      return formRow(path, name, s, kind, choices, required.has(name), nullable);
    });
    return el("fieldset", { "data-group": group }, el("legend", {}, group), el("p", { class: "muted small" }, plainText(schema.description)), rows);
  });
  const paste = el("details", { id: "json-paste", class: "card" },
    el("summary", {}, "Paste a request as JSON (or copy this form's)"),
    el("textarea", { id: "request-json", rows: 10, spellcheck: "false", "aria-label": "request as JSON", placeholder: '{"model": {...}, "cluster": {...}, "training": {...}, "search": {...}}' }),
    el("div", { class: "error", id: "json-error", "aria-live": "polite" }),
    el("div", { class: "gantt-tools" },
      el("button", { type: "button", id: "json-fill", onclick: fillFromJson }, "Fill the form from this JSON"),
      el("button", { type: "button", id: "json-show", onclick: showFormAsJson }, "Show the form as JSON")));
  const form = el("form", { id: "plan-form", novalidate: "" }, sets,
    el("div", { class: "banner bad", id: "form-error", role: "alert", hidden: "" }),
    el("div", { class: "gantt-tools" },
      el("button", { class: "primary", type: "submit", id: "submit" }, "Plan it"),
      el("button", { type: "button", id: "form-reset", onclick: () => resetForm(form) }, "Start again from the example")));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); submitForm(form); });
  form.addEventListener("input", saveDraft);
  form.addEventListener("change", saveDraft);
  paste.addEventListener("input", saveDraft);
  app.replaceChildren(el("h1", {}, "Plan a run"),
    el("p", { class: "muted" }, "The planner searches tensor, pipeline and data parallelism, micro-batch size, recomputation and the schedule, and shows why it chose what it chose. Every field of the request is here; fields marked * are required, an empty optional field takes its default. ",
      el("a", { href: "/redoc#operation/create_plan_v1_plans_post" }, "The request reference"), " says more."),
    paste, form);
  fillForm(FORM_PRESET, true);
  restoreDraft();
}

// Each field as typed (the text of a field, the boxes ticked), and the JSON box.
function saveDraft() {
  const fields = {};
  for (const f of formFields) {
    const node = document.getElementById(f.path);
    fields[f.path] = f.kind === "bool" ? node.checked : f.kind === "choices" ? [...node.querySelectorAll("input:checked")].map((i) => i.value) : node.value;
  }
  keepDraft(FORM_DRAFT, { fields, json: document.getElementById("request-json").value });
}
function restoreDraft() {
  const draft = readDraft(FORM_DRAFT);
  if (!draft || typeof draft.fields !== "object") return;
  for (const f of formFields) {
    if (!Object.prototype.hasOwnProperty.call(draft.fields, f.path)) continue;
    const value = draft.fields[f.path], node = document.getElementById(f.path);
    if (f.kind === "bool") node.checked = Boolean(value);
    else if (f.kind === "choices") { for (const box of node.querySelectorAll("input")) box.checked = Array.isArray(value) && value.includes(box.value); }
    else if (f.kind === "select") { if ([...node.options].some((o) => o.value === value)) node.value = value; }
    else node.value = typeof value === "string" ? value : "";
  }
  if (typeof draft.json === "string") document.getElementById("request-json").value = draft.json;
}
function resetForm(form) {
  dropDraft(FORM_DRAFT);
  clearErrors(form);
  document.getElementById("request-json").value = "";
  document.getElementById("json-error").textContent = "";
  fillForm(FORM_PRESET, true);
}

// One field: its label, its input, its hint (description, limits, default) and its error,
// the last two read with the input by a screen reader (aria-describedby). A group of boxes
// (schedules, recompute) is a named group, since a <label> can only name one control.
function formRow(path, name, s, kind, choices, required, nullable) {
  let input;
  const common = { id: path, "aria-describedby": `${path}-hint ${path}-error` };
  if (kind === "bool") input = el("input", { type: "checkbox", ...common });
  else if (kind === "number") input = el("input", { type: "number", ...common, step: s.type === "integer" ? 1 : "any", min: s.minimum ?? s.exclusiveMinimum ?? null, max: s.maximum ?? null, placeholder: nullable ? "default" : "" });
  else if (kind === "select") input = el("select", common, choices.map((c) => el("option", { value: c }, c)));
  else if (kind === "choices") input = el("div", { class: "checks", role: "group", "aria-labelledby": `${path}-label`, ...common }, choices.map((c) => el("label", {}, el("input", { type: "checkbox", value: c }), " " + c)));
  else if (kind === "list") input = el("input", { type: "text", ...common, placeholder: nullable ? "default (comma-separated numbers)" : "comma-separated numbers" });
  else input = el("input", { type: "text", ...common });
  const hint = [plainText(s.description), limitsText(s), s.default !== undefined && s.default !== null ? `default ${JSON.stringify(s.default)}` : ""].filter(Boolean).join(" — ");
  const text = fieldLabel(name) + (required ? " *" : "");
  return el("div", { class: "row", "data-field": path },
    kind === "choices" ? el("span", { class: "label", id: `${path}-label`, title: path }, text) : el("label", { for: path, id: `${path}-label`, title: path }, text),
    el("div", {}, input, el("div", { class: "hint", id: `${path}-hint` }, hint), el("div", { class: "error", id: `${path}-error`, "data-error": path })));
}

// Sets every field from `request` (a PlanRequest object); fields it leaves out take their
// schema default when `defaults`, else are left empty.
function fillForm(request, defaults) {
  for (const f of formFields) {
    const given = request[f.group] && Object.prototype.hasOwnProperty.call(request[f.group], f.name);
    const value = given ? request[f.group][f.name] : defaults ? f.schema.default : undefined;
    const node = document.getElementById(f.path);
    if (f.kind === "bool") node.checked = value === undefined ? false : Boolean(value);
    else if (f.kind === "choices") {
      const on = value === undefined || value === null ? (f.schema.default || (f.name === "recompute" ? f.schema.items.enum : [])) : value;
      for (const box of node.querySelectorAll("input")) box.checked = on.includes(box.value);
    } else if (f.kind === "list") node.value = Array.isArray(value) ? value.join(", ") : "";
    else if (f.kind === "select") { if (value !== undefined && value !== null) node.value = String(value); }
    else node.value = value === undefined || value === null ? "" : String(value);
  }
}

function fillFromJson() {
  const out = document.getElementById("json-error");
  out.textContent = "";
  let request;
  try { request = JSON.parse(document.getElementById("request-json").value); }
  catch (e) { out.textContent = `Not JSON: ${e.message}. Paste a PlanRequest object.`; return; }
  if (!request || typeof request !== "object" || Array.isArray(request)) { out.textContent = "Paste a JSON object with model, cluster, training and search."; return; }
  const known = new Set(formFields.map((f) => f.path));
  const groups = new Set(formFields.map((f) => f.group));
  const unknown = [];
  for (const [group, fields] of Object.entries(request)) {
    if (!groups.has(group)) { unknown.push(group); continue; }
    for (const name of Object.keys(fields || {})) if (!known.has(`${group}.${name}`)) unknown.push(`${group}.${name}`);
  }
  if (unknown.length) { out.textContent = `Unknown fields: ${unknown.join(", ")}. Remove them or check their spelling (the form lists every field).`; return; }
  // A value the form cannot hold (a GPU it does not list, a schedule misspelt, a number
  // where a list goes) would be dropped or changed on the way in: name it, fill nothing.
  const wrong = [];
  for (const [group, fields] of Object.entries(request)) if (fields !== null && (typeof fields !== "object" || Array.isArray(fields))) wrong.push(`${group}: ${JSON.stringify(fields)} is not an object of fields`);
  for (const f of formFields) {
    const fields = request[f.group];
    if (!fields || typeof fields !== "object" || !Object.prototype.hasOwnProperty.call(fields, f.name)) continue;
    const why = unholdable(f, fields[f.name]);
    if (why) wrong.push(`${f.path}: ${why}`);
  }
  if (wrong.length) { out.textContent = `Not filled: ${wrong.join("; ")}. Change ${wrong.length > 1 ? "these values" : "this value"} in the JSON and fill again.`; return; }
  fillForm(request, true);
  out.textContent = "";
  saveDraft();
}

// Why the form cannot hold `value` for field `f` as it is, or "" when it can.
function unholdable(f, value) {
  const shown = JSON.stringify(value);
  if (value === null) return f.nullable ? "" : `null is not allowed: give a value${f.required ? "" : ", or leave the field out for its default"}`;
  if (f.kind === "bool") return typeof value === "boolean" ? "" : `${shown} is not true or false`;
  if (f.kind === "number") return typeof value === "number" || (typeof value === "string" && NUMBER.test(value.trim())) ? "" : `${shown} is not a number`;
  if (f.kind === "select") {
    const options = [...document.getElementById(f.path).options].map((o) => o.value);
    return options.includes(String(value)) ? "" : `${shown} is not one of ${options.join(", ")}`;
  }
  if (f.kind === "choices") {
    if (!Array.isArray(value)) return `${shown} is not a list: write [${shown}]`;
    const options = (f.schema.items && f.schema.items.enum) || [];
    const bad = value.filter((v) => !options.includes(v));
    if (bad.length) return `${bad.map((v) => JSON.stringify(v)).join(", ")} ${bad.length > 1 ? "are" : "is"} not one of ${options.join(", ")}`;
    return value.length ? "" : "[] names none: name at least one, or leave the field out for its default";
  }
  if (f.kind === "list") return Array.isArray(value) ? "" : `${shown} is not a list: write [${shown}]`;
  return typeof value === "string" ? "" : `${shown} is not text`;
}

// A list field as typed: numbers separated by commas, semicolons or spaces, with or
// without the brackets of JSON; the words that are not numbers in `bad`.
function parseList(text) {
  const tokens = text.trim().replace(/^\[/, "").replace(/\]$/, "").split(/[,;\s]+/).filter(Boolean);
  return { values: tokens.map((t) => (NUMBER.test(t) ? Number(t) : t)), bad: tokens.filter((t) => !NUMBER.test(t)) };
}

function showFormAsJson() {
  const problems = [];
  document.getElementById("request-json").value = JSON.stringify(readForm(problems), null, 2);
  document.getElementById("json-error").textContent = problems.length
    ? `Not in the JSON as typed: ${problems.map((p) => `${p.path}: ${p.msg}`).join("; ")}.` : "";
  saveDraft();
}

// The request the form holds. A field it cannot read as typed goes into `problems`
// ({path, msg}) rather than silently out of the request: a number field holding what is not
// a number reads as empty in the browser, and an empty optional field means its default.
function readForm(problems = []) {
  const request = {};
  for (const f of formFields) {
    const node = document.getElementById(f.path);
    let value;
    if (f.kind === "bool") value = node.checked;
    else if (f.kind === "choices") { value = [...node.querySelectorAll("input:checked")].map((i) => i.value); if (!value.length) value = undefined; }
    else if (f.kind === "number") {
      if (node.validity && node.validity.badInput) { problems.push({ path: f.path, msg: "this is not a number: write digits, e.g. 8 or 0.5" }); continue; }
      value = node.value === "" ? undefined : Number(node.value);
    } else if (f.kind === "list") {
      const { values, bad } = parseList(node.value);
      if (bad.length) problems.push({ path: f.path, msg: `${bad.map((b) => `"${b}"`).join(", ")} ${bad.length > 1 ? "are" : "is"} not a number: write numbers separated by commas, e.g. 1, 2, 4` });
      value = values.length ? values : undefined;
    } else value = node.value === "" ? undefined : node.value;
    if (value === undefined && f.required) { problems.push({ path: f.path, msg: "required: fill it in" }); value = null; }
    if (value === undefined) continue;
    (request[f.group] = request[f.group] || {})[f.name] = value;
  }
  return request;
}

// The fields an error belongs to: its location when it names a field, else the fields its
// message names (a model-level check such as heads dividing the hidden size names both).
function fieldsOfError(loc, message) {
  const path = loc.filter((x) => x !== "body").join(".");
  const exact = formFields.filter((f) => f.path === path || path.startsWith(f.path + "."));
  if (exact.length) return exact;
  const scope = formFields.filter((f) => !path || f.path.startsWith(path + "."));
  const named = scope.filter((f) => new RegExp(`(^|[^\\w.])(${f.group}\\.)?${f.name}([^\\w]|$)`).test(message) && (f.name.includes("_") || message.includes(f.path)));
  return named;
}

function clearErrors(form) {
  for (const e of form.querySelectorAll("[data-error]")) e.textContent = "";
  clearInvalid(form);
  document.getElementById("form-error").hidden = true;
}

async function submitForm(form) {
  clearErrors(form);
  // What the form cannot read is said at its field, and nothing is sent.
  const problems = [];
  const request = readForm(problems);
  if (problems.length) return showErrors(form, problems.map((p) => ({ loc: ["body", ...p.path.split(".")], msg: p.msg })));
  const button = document.getElementById("submit");
  button.disabled = true; button.textContent = "Planning…";
  const live = pageTicket();
  const { status, headers, body } = await api("/v1/plans", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(request) });
  button.disabled = false; button.textContent = "Plan it";
  if (!live()) return; // the person has moved on: the plan is in the list
  if (status === 200 || status === 201) { location.hash = `#/plans/${body.id}`; return; }
  if (status === 202) { const loc = headers.get("Location") || ""; location.hash = "#" + loc.replace(/^\/v1/, "").replace(/^\/?/, "/"); return; }
  showErrors(form, (body && (body.errors || body.invalid_params)) || [{ loc: [], msg: problemText(body) }]);
}

// Each error at its field(s) (marked, and aria-invalid), and all of them in the banner.
function showErrors(form, errors) {
  const banner = document.getElementById("form-error");
  const lines = [];
  let marked = 0;
  for (const err of errors) {
    const loc = err.loc || err.location || [];
    const message = err.msg || err.message || err.reason || "";
    const fields = fieldsOfError(loc, message);
    for (const f of fields) {
      const target = form.querySelector(`[data-error="${f.path}"]`);
      target.textContent = target.textContent ? `${target.textContent} ${message}` : message;
      markInvalid(document.getElementById(f.path));
      marked++;
    }
    const where = fields.length ? fields.map((f) => fieldLabel(f.name)).join(" and ") : loc.filter((x) => x !== "body").join(" › ");
    lines.push(where ? `${where}: ${message}` : message);
  }
  banner.textContent = (marked ? "Fix the marked fields. " : "") + lines.join(" ");
  banner.hidden = false;
  const first = form.querySelector(".field-error");
  (first || banner).scrollIntoView({ block: "center" });
}
