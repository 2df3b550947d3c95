// stagewright dashboard: plans, every candidate of a plan and why, a form for new requests,
// and the hardware and profiles the planner reads. Plain JavaScript, SVG and canvas, served
// by the API itself (no CDN: the machines that run it may have no network). This file holds
// the helpers and the routing; plan.js, charts.js, gantt.js, form.js and sweep.js the pages.
"use strict";

const app = document.getElementById("app");
// Action colours from style.css; F2, B2, ... are a V schedule's second chunk.
const KINDS = ["F", "B", "W", "BW", "EVICT", "LOAD", "STEP", "F2", "B2", "W2", "BW2"];
const COLORS = {};
for (const k of KINDS) COLORS[k] = getComputedStyle(document.documentElement).getPropertyValue("--" + k).trim() || "#999";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}
function svgEl(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}
const fmt = (x, d = 2) => (x === null || x === undefined || Number.isNaN(x)) ? "–" : Number(x).toFixed(d);
const pct = (x) => x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%";
// cp (context parallelism) is named only when it is used, as the CLI's plan table does.
const cfgText = (c) => `t${c.t}${(c.cp || 1) > 1 ? ` cp${c.cp}` : ""} p${c.p} d${c.d} mb${c.micro_batch_size} ${c.recompute} ${c.schedule}`;
const plural = (k, word, many) => `${k.toLocaleString("en")} ${k === 1 ? word : (many || word + "s")}`;

// Round tick values: steps of 1, 2 or 5 x 10^k, about `count` of them covering [lo, hi].
function niceTicks(lo, hi, count) {
  const span = hi - lo;
  if (!(span > 0)) return { step: 1, ticks: [lo] };
  const raw = span / Math.max(1, count);
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((f) => f * power).find((s) => s >= raw * (1 - 1e-9));
  const ticks = [];
  for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++) ticks.push(+(k * step).toPrecision(12));
  return { step, ticks };
}
// niceTicks whose last tick reaches hi: an axis that ends on a round value past the data.
function niceAxis(lo, hi, count) {
  const t = niceTicks(lo, hi, count);
  while (t.ticks[t.ticks.length - 1] < hi - t.step * 1e-9) t.ticks.push(+(t.ticks[t.ticks.length - 1] + t.step).toPrecision(12));
  return t;
}
const stepDecimals = (step) => Math.max(0, -Math.floor(Math.log10(step) + 1e-9));

// Every request of the dashboard. It always answers {status, headers, body}: a service that
// cannot be reached is status 0, and an answer that is not JSON (a proxy's error page) is a
// sentence about it, never the page's HTML source.
// The token a person entered in the page's Token field (kept for the tab only) goes with
// every request; a server without tokens ignores it.
const TOKEN_KEY = "stagewright-token";
function apiToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch { return ""; }
}
function setApiToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token); else sessionStorage.removeItem(TOKEN_KEY);
  } catch { /* storage off: the token cannot be kept */ }
}
function withToken(headers, token) {
  return token ? { ...headers, "Authorization": `Bearer ${token}` } : headers;
}
function unreachable(error) {
  return { status: 0, headers: new Headers(), body: { detail: `Could not reach the stagewright service (${error.message}). Check that it is running and that this browser can reach it, then reload the page.` } };
}
async function api(path, options = {}) {
  const token = apiToken();
  let response;
  try {
    response = await fetch(path, { ...options, headers: withToken({ "Accept": "application/json", ...(options.headers || {}) }, token) });
  } catch (error) {
    return unreachable(error);
  }
  return answerOf(response, token);
}
// A response as {status, headers, body}: the body parsed, or a sentence where it is not JSON;
// a refusal of the token said in the page's words. `token` is the one the request sent.
async function answerOf(response, token) {
  let text;
  try { text = await response.text(); } catch (error) { return unreachable(error); }
  let body = null;
  try { body = text ? JSON.parse(text) : null; }
  catch {
    const what = `${response.status} ${response.statusText || ""}`.trim();
    body = { detail: `The server answered ${what} with a page that is not stagewright's (a proxy in front of it, or the service restarting). Try again in a moment; if it persists, look at the service's log.` };
  }
  if ((response.status === 401 || response.status === 403) && body && typeof body === "object") {
    // The server's words name a header a browser user does not write: say where the token goes.
    const what = response.status === 401
      ? (token ? "The token in the Token field at the top of the page is not one this server knows." : "This server needs a token for this: enter one in the Token field at the top of the page.")
      : "The token in the Token field at the top of the page may not do this: ask the operator for one with the scope it needs.";
    body = { ...body, detail: `${what} (The server said: ${body.detail || body.title || response.status})` };
  }
  return { status: response.status, headers: response.headers, body };
}
// A link to a file of the API: a plain link cannot send the token, so where one is entered
// the file is fetched with it and handed to the browser as a download; a refusal is said
// beside the link. Returns the link.
function tokenLink(link, filename) {
  link.addEventListener("click", async (ev) => {
    const token = apiToken();
    if (!token) return; // no token entered: the plain link does it
    ev.preventDefault();
    link.parentNode.querySelector(`[data-refusal="${link.id}"]`)?.remove();
    let response = null, failure = null;
    try { response = await fetch(link.href, { headers: withToken({}, token) }); }
    catch (error) { failure = error; }
    if (!response || !response.ok) {
      const said = response ? (await answerOf(response, token)).body : unreachable(failure).body;
      link.after(el("span", { class: "bad", "data-refusal": link.id }, ` (${problemText(said)})`));
      return;
    }
    const url = URL.createObjectURL(await response.blob());
    const save = el("a", { href: url, download: filename });
    document.body.append(save); save.click(); save.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  });
  return link;
}
// What a person typed on a page, kept for the tab (sessionStorage) so that the back button or
// a reload does not throw it away; where storage is off nothing is kept, and null is read.
function readDraft(key) {
  try { return JSON.parse(sessionStorage.getItem(key) || "null"); } catch { return null; }
}
function keepDraft(key, value) {
  try { sessionStorage.setItem(key, JSON.stringify(value)); } catch { /* storage off */ }
}
function dropDraft(key) {
  try { sessionStorage.removeItem(key); } catch { /* storage off */ }
}
// A field in error: its input marked for screen readers, its row for the eye; and every such
// mark inside `root` cleared.
function markInvalid(input) {
  input.setAttribute("aria-invalid", "true");
  input.closest(".row").classList.add("field-error");
}
function clearInvalid(root) {
  for (const r of root.querySelectorAll(".field-error")) r.classList.remove("field-error");
  for (const i of root.querySelectorAll("[aria-invalid]")) i.removeAttribute("aria-invalid");
}

function problemText(body) {
  if (!body) return "the server did not answer";
  if (typeof body === "string") return body;
  return body.detail || body.title || JSON.stringify(body);
}

// ------------------------------------------------------------------ routing
function setNav(name) {
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.nav === name);
}
// A page fetches before it draws, and the person may have moved on by the time the answer
// comes: every page takes a ticket when it starts (`pageTicket()`) and draws only while
// `live()` says no other page has started since.
let routeSeq = 0;
function pageTicket() { const n = routeSeq; return () => n === routeSeq; }
async function route() {
  routeSeq++;
  const hash = location.hash || "#/";
  let m;
  // A plan's page names what it shows: #/plans/ID (the best), #/plans/ID/candidates/RANK
  // (1 = best) or #/plans/ID/rejected/N (the N-th rejected configuration).
  // The whole address is read: a link cut or mistyped after the id is said, not shown as
  // another plan or page.
  if ((m = hash.match(/^#\/plans\/([^\/]+)(?:\/(candidates|rejected)\/(\d+))?\/?$/))) {
    setNav("plans");
    return showPlan(m[1], m[2] ? { kind: m[2], n: Number(m[3]) } : { kind: "candidates", n: 1 });
  }
  if (hash.startsWith("#/plans/")) {
    setNav("plans");
    return app.replaceChildren(el("div", { class: "banner bad" },
      `No page ${hash}: a plan's links are #/plans/ID, #/plans/ID/candidates/N and #/plans/ID/rejected/N. `,
      el("a", { href: "#/" }, "See the plans in the store.")));
  }
  if (hash.startsWith("#/new")) { setNav("new"); return showForm(); }
  if (hash.startsWith("#/hardware")) { setNav("hardware"); return showHardware(); }
  if (hash.startsWith("#/memory")) { setNav("memory"); return showMemorySweep(); }
  setNav("plans");
  return showPlans();
}
window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);
window.addEventListener("DOMContentLoaded", () => {
  const field = document.getElementById("api-token");
  field.value = apiToken();
  // The page shown is read again with the new token (a draft on the form is kept).
  field.addEventListener("change", () => { setApiToken(field.value.trim()); route(); });
});

// ------------------------------------------------------------------ plan list
async function showPlans() {
  const live = pageTicket();
  app.replaceChildren(el("h1", {}, "Plans"), el("p", { class: "muted" }, "Loading…"));
  const { status, body } = await api("/v1/plans?limit=100");
  if (!live()) return;
  if (status !== 200) return app.replaceChildren(el("div", { class: "banner bad" }, problemText(body)));
  const items = body.items || body.plans || body || [];
  const rows = items.map((p) => el("tr", {},
    el("td", { class: "l" }, el("a", { href: `#/plans/${p.id}` }, p.id.slice(0, 8))),
    el("td", { class: "l" }, p.model_name || "–"),
    el("td", { class: "l" }, `${p.num_gpus} × ${p.gpu}`),
    el("td", { class: "l" }, el("span", { class: "tag" }, p.status || "done")),
    el("td", { class: "l" }, p.best_config ? cfgText(p.best_config) : "–"),
    el("td", {}, p.best_predicted ? fmt(p.best_predicted.samples_per_s, 3) : "–"),
    el("td", { class: "l" }, (p.created_at || "").replace("T", " ").slice(0, 19)),
  ));
  app.replaceChildren(
    el("h1", {}, "Plans"),
    el("p", { class: "muted" }, `${items.length} plans in the store. `, el("a", { href: "#/new" }, "Plan a new run.")),
    items.length ? el("div", { class: "scroll" }, el("table", { id: "plans" },
      el("thead", {}, el("tr", {}, ["id", "model", "cluster", "status", "best configuration", "samples/s", "created"].map((h, i) => el("th", { class: i === 5 ? "" : "l" }, h)))),
      el("tbody", {}, rows))) : el("div", { class: "card" }, "No plans yet."),
  );
}

// ------------------------------------------------------------------ hardware and profiles
async function showHardware() {
  const live = pageTicket();
  const [hw, prof] = await Promise.all([api("/v1/hardware"), api("/v1/profiles")]);
  if (!live()) return;
  const parts = [el("h1", {}, "Hardware and profiles")];
  if (hw.status !== 200) parts.push(el("div", { class: "banner bad" }, problemText(hw.body)));
  else {
    const items = hw.body.items || hw.body;
    parts.push(sortableTable("hardware", [
      { label: "name", value: (h) => h.name, left: true },
      { label: "bf16 TFLOP/s", value: (h) => ((h.peak_flops || {}).bf16 || 0) / 1e12, text: (h) => fmt(((h.peak_flops || {}).bf16 || 0) / 1e12, 0) },
      { label: "memory GiB", value: (h) => h.memory_gib, text: (h) => fmt(h.memory_gib, 1) },
      { label: "usable GiB", value: (h) => h.usable_memory_gib, text: (h) => fmt(h.usable_memory_gib, 1) },
      { label: "HBM GB/s", value: (h) => h.memory_bandwidth_gbps },
      { label: "in-node link", value: (h) => h.intra_node ? `${h.intra_node.kind} ${h.intra_node.bandwidth_gbps} GB/s` : "–", left: true },
      { label: "between nodes", value: (h) => h.inter_node ? `${h.inter_node.kind} ${h.inter_node.bandwidth_gbps} GB/s` : "–", left: true },
    ], items, { index: 0, dir: 1 }));
  }
  parts.push(el("h2", {}, "Layer profiles (the points the cost model interpolates)"));
  if (prof.status !== 200) parts.push(el("div", { class: "banner bad" }, problemText(prof.body)));
  else {
    const points = prof.body.layers || prof.body.items || prof.body;
    parts.push(sortableTable("profiles", [
      { label: "gpu", value: (p) => p.gpu, left: true }, { label: "hidden", value: (p) => p.hidden_size },
      { label: "heads", value: (p) => p.num_attention_heads }, { label: "seq", value: (p) => p.seq_length },
      { label: "mb", value: (p) => p.micro_batch_size }, { label: "t", value: (p) => p.t },
      { label: "recompute", value: (p) => p.recompute, left: true },
      { label: "F ms", value: (p) => p.forward_ms, text: (p) => fmt(p.forward_ms, 3) },
      { label: "B ms", value: (p) => p.backward_ms, text: (p) => fmt(p.backward_ms, 3) },
      { label: "W ms", value: (p) => p.weight_ms ?? -1, text: (p) => fmt(p.weight_ms, 3) },
      { label: "source", value: (p) => p.source || "", left: true },
    ], points, { index: 0, dir: 1 }));
  }
  app.replaceChildren(...parts);
}
