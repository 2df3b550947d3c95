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
    el("textarea", { id: "request-json", rows: 10, spellcheck: "false", placeholder: '{"model": {...}, "cluster": {...}, "training": {...}, "search": {...}}' }),
    el("div", { class: "error", id: "json-error" }),
    el("div", { class: "gantt-tools" },
      el("button", { type: "button", id: "json-fill", onclick: fillFromJson }, "Fill the form from this JSON"),
      el("button", { type: "button", id: "json-show", onclick: () => { document.getElementById("request-json").value = JSON.stringify(readForm(), null, 2); } }, "Show the form as JSON")));
  const form = el("form", { id: "plan-form", novalidate: "" }, sets,
    el("div", { class: "banner bad", id: "form-error", hidden: "" }),
    el("button", { class: "primary", type: "submit", id: "submit" }, "Plan it"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); submitForm(form); });
  app.replaceChildren(el("h1", {}, "Plan a run"),
    el("p", { class: "muted" }, "The planner searches tensor, pipeline and data parallelism, micro-batch size, recomputation and the schedule, and shows why it chose what it chose. Every field of the request is here; fields marked * are required, an empty optional field takes its default. ",
      el("a", { href: "/redoc#operation/create_plan_v1_plans_post" }, "The request reference"), " says more."),
    paste, form);
  fillForm(FORM_PRESET, true);
}

function formRow(path, name, s, kind, choices, required, nullable) {
  let input;
  if (kind === "bool") input = el("input", { type: "checkbox", id: path });
  else if (kind === "number") input = el("input", { type: "number", id: path, step: s.type === "integer" ? 1 : "any", min: s.minimum ?? s.exclusiveMinimum ?? null, max: s.maximum ?? null, placeholder: nullable ? "default" : "" });
  else if (kind === "select") input = el("select", { id: path }, choices.map((c) => el("option", { value: c }, c)));
  else if (kind === "choices") input = el("div", { class: "checks", id: path }, choices.map((c) => el("label", {}, el("input", { type: "checkbox", value: c }), " " + c)));
  else if (kind === "list") input = el("input", { type: "text", id: path, placeholder: nullable ? "default (comma-separated numbers)" : "comma-separated numbers" });
  else input = el("input", { type: "text", id: path });
  const hint = [plainText(s.description), limitsText(s), s.default !== undefined && s.default !== null ? `default ${JSON.stringify(s.default)}` : ""].filter(Boolean).join(" — ");
  return el("div", { class: "row", "data-field": path },
    el("label", { for: path, title: path }, fieldLabel(name) + (required ? " *" : "")),
    el("div", {}, input, el("div", { class: "hint" }, hint), el("div", { class: "error", "data-error": path })));
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
  fillForm(request, true);
  out.textContent = "";
}

function readForm() {
  const request = {};
  for (const f of formFields) {
    const node = document.getElementById(f.path);
    let value;
    if (f.kind === "bool") value = node.checked;
    else if (f.kind === "choices") { value = [...node.querySelectorAll("input:checked")].map((i) => i.value); if (!value.length) value = undefined; }
    else if (f.kind === "number") value = node.value === "" ? undefined : Number(node.value);
    else if (f.kind === "list") value = node.value.trim() === "" ? undefined : node.value.split(/[,\s]+/).filter(Boolean).map((x) => (/^-?\d+(\.\d+)?$/.test(x) ? Number(x) : x));
    else value = node.value === "" ? undefined : node.value;
    if (value === undefined && f.required) value = null; // the server names the missing field
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

async function submitForm(form) {
  for (const e of form.querySelectorAll("[data-error]")) e.textContent = "";
  for (const r of form.querySelectorAll(".field-error")) r.classList.remove("field-error");
  const banner = document.getElementById("form-error");
  banner.hidden = true;
  const button = document.getElementById("submit");
  button.disabled = true; button.textContent = "Planning…";
  const live = pageTicket();
  const { status, headers, body } = await api("/v1/plans", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(readForm()) });
  button.disabled = false; button.textContent = "Plan it";
  if (!live()) return; // the person has moved on: the plan is in the list
  if (status === 200 || status === 201) { location.hash = `#/plans/${body.id}`; return; }
  if (status === 202) { const loc = headers.get("Location") || ""; location.hash = "#" + loc.replace(/^\/v1/, "").replace(/^\/?/, "/"); return; }
  const errors = (body && (body.errors || body.invalid_params)) || [{ loc: [], msg: problemText(body) }];
  const lines = [];
  let marked = 0;
  for (const err of errors) {
    const loc = err.loc || err.location || [];
    const message = err.msg || err.message || err.reason || "";
    const fields = fieldsOfError(loc, message);
    for (const f of fields) {
      const target = form.querySelector(`[data-error="${f.path}"]`);
      target.textContent = target.textContent ? `${target.textContent} ${message}` : message;
      target.closest(".row").classList.add("field-error");
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
