// stagewright dashboard: plans, a plan's candidates and why, a form for new requests, and
// the hardware and profiles the planner reads. Plain JavaScript, SVG and canvas, served by
// the API itself (no CDN: the machines that run it may have no network).
"use strict";

const app = document.getElementById("app");
const KINDS = ["F", "B", "W", "BW", "EVICT", "LOAD", "STEP"];
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
const cfgText = (c) => `t${c.t} p${c.p} d${c.d} mb${c.micro_batch_size} ${c.recompute} ${c.schedule}`;

async function api(path, options = {}) {
  const response = await fetch(path, { headers: { "Accept": "application/json", ...(options.headers || {}) }, ...options });
  let body = null;
  const text = await response.text();
  try { body = text ? JSON.parse(text) : null; } catch { body = { detail: text }; }
  return { status: response.status, headers: response.headers, body };
}
function problemText(body) {
  if (!body) return "the server did not answer";
  return body.detail || body.title || JSON.stringify(body);
}

// ------------------------------------------------------------------ routing
function setNav(name) {
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.nav === name);
}
async function route() {
  const hash = location.hash || "#/";
  let m;
  if ((m = hash.match(/^#\/plans\/([\w-]+)/))) { setNav("plans"); return showPlan(m[1]); }
  if (hash.startsWith("#/new")) { setNav("new"); return showForm(); }
  if (hash.startsWith("#/hardware")) { setNav("hardware"); return showHardware(); }
  if (hash.startsWith("#/memory")) { setNav("memory"); return showMemorySweep(); }
  setNav("plans");
  return showPlans();
}
window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);

// ------------------------------------------------------------------ plan list
async function showPlans() {
  app.replaceChildren(el("h1", {}, "Plans"), el("p", { class: "muted" }, "Loading…"));
  const { status, body } = await api("/v1/plans?limit=100");
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

// ------------------------------------------------------------------ plan page
async function showPlan(id) {
  app.replaceChildren(el("p", { class: "muted" }, "Loading plan…"));
  const { status, body } = await api(`/v1/plans/${id}?include_rejected=true`);
  if (status === 404) return app.replaceChildren(el("div", { class: "banner bad" }, `No plan ${id}.`));
  if (status !== 200) return app.replaceChildren(el("div", { class: "banner bad" }, problemText(body)));
  const state = body.status || "done";
  const plan = state === "done" ? body : null;
  if (!plan) {
    app.replaceChildren(el("h1", {}, `Plan ${id.slice(0, 8)}`),
      el("div", { class: "card" }, `Status: ${state}. `, state === "failed" ? problemText(body.error || body) : "This page refreshes until the search finishes."));
    if (state !== "failed") setTimeout(() => { if (location.hash === `#/plans/${id}`) showPlan(id); }, 1000);
    return;
  }
  const hw = await api("/v1/hardware");
  const entry = hw.status === 200 ? (hw.body.items || hw.body).find((h) => h.name === plan.request.cluster.gpu) : null;
  plan.capacity_gib = entry ? entry.usable_memory_gib : null;
  renderPlan(id, plan);
}

function renderPlan(id, plan) {
  const req = plan.request;
  const best = plan.best;
  const cap = plan.capacity_gib || null;
  const header = el("div", {},
    el("h1", {}, `${req.model.name} on ${req.cluster.num_nodes} × ${req.cluster.gpus_per_node} ${req.cluster.gpu}`),
    el("p", { class: "muted" }, `global batch ${req.training.global_batch_size}, sequence ${req.model.seq_length}, ${req.training.precision}; ` +
      `${plan.stats.evaluated} configurations, ${plan.stats.feasible} fit, searched in ${fmt(plan.stats.search_ms, 0)} ms (${req.search.method})`));
  const parts = [header];
  if (!best) {
    parts.push(el("div", { class: "banner bad", id: "no-fit" }, "No configuration fits in memory. The rejected list below says why for each."));
  } else {
    const p = best.predicted;
    parts.push(el("div", { class: "kpis", id: "best" },
      kpi("best configuration", cfgText(best.config)),
      kpi("samples / s", fmt(p.samples_per_s, 3)), kpi("tokens / s", fmt(p.tokens_per_s, 0)),
      kpi("step time", fmt(p.iteration_time_s, 3) + " s"), kpi("MFU", pct(p.mfu)),
      kpi("bubble", pct(p.bubble_fraction)), kpi("peak memory", fmt(p.peak_memory_gib, 1) + " GiB")));
    if (best.semantics === "stale") parts.push(el("div", { class: "banner bad", id: "stale-weights" },
      `${best.config.schedule} updates weights with gradients of older weights (stale weights): it changes the training, not only its speed. The request allowed it (search.allow_stale_weights).`));
    if (best.refinement) parts.push(el("div", { class: "card" }, el("b", {}, `CP-SAT (${best.refinement.status}): `), best.refinement.changes.join("; ")));
    for (const note of best.notes || []) parts.push(el("div", { class: "muted" }, "• " + note));
  }
  parts.push(el("h2", {}, "Candidates"), candidatesTable(plan));
  parts.push(el("div", { class: "grid2" },
    el("div", {}, el("h2", {}, "Throughput against peak memory"), scatter(plan, cap)),
    el("div", {}, el("h2", {}, "Memory per device (best)"), best ? memoryBars(best, cap) : el("p", { class: "muted" }, "–"))));
  if (plan.by_schedule && plan.by_schedule.length) parts.push(el("h2", {}, "Does a schedule pay off here?"), scheduleTable(plan));
  if (best) {
    const gantt = el("div", { id: "gantt-box" }, el("p", { class: "muted" }, "Simulating the schedule…"));
    const n = (k, word) => `${k} ${word}${k === 1 ? "" : "s"}`;
    parts.push(el("h2", {}, `Schedule timeline: ${best.config.schedule}, ${n(best.config.p, "device")}, ${n(best.config.num_microbatches, "micro-batch")}`.replace("micro-batchs", "micro-batches")), gantt);
    loadTimeline(id, gantt);
    parts.push(el("h2", {}, "Launch"), launchBlock(id, best));
  }
  parts.push(el("h2", {}, `Rejected (${plan.rejected.length})`), rejectedTable(plan));
  app.replaceChildren(...parts);
}
function kpi(k, v) { return el("div", { class: "kpi" }, el("div", { class: "k" }, k), el("div", { class: "v" }, v)); }

function sortableTable(id, columns, rows, initial) {
  // columns: [{label, value(row), text(row), left}]; rows: objects
  const table = el("table", { id });
  const thead = el("thead"), tbody = el("tbody");
  let key = initial ? initial.index : -1, dir = initial ? initial.dir : 1;
  function draw() {
    const sorted = rows.slice();
    if (key >= 0) sorted.sort((a, b) => {
      const x = columns[key].value(a), y = columns[key].value(b);
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    tbody.replaceChildren(...sorted.map((r) => el("tr", { class: r.__best ? "best" : "" }, columns.map((c) => el("td", { class: c.left ? "l" : "" }, c.text ? c.text(r) : c.value(r))))));
    thead.replaceChildren(el("tr", {}, columns.map((c, i) => el("th", {
      class: `sortable ${c.left ? "l" : ""} ${i === key ? (dir > 0 ? "sorted-asc" : "sorted-desc") : ""}`,
      onclick: () => { if (key === i) dir = -dir; else { key = i; dir = 1; } draw(); },
    }, c.label))));
  }
  table.append(thead, tbody);
  draw();
  return el("div", { class: "scroll" }, table);
}

function candidatesTable(plan) {
  const rows = plan.candidates.map((c, i) => ({ ...c, __rank: i + 1, __best: i === 0 }));
  const cols = [
    { label: "#", value: (r) => r.__rank },
    { label: "t", value: (r) => r.config.t }, { label: "p", value: (r) => r.config.p }, { label: "d", value: (r) => r.config.d },
    { label: "mb", value: (r) => r.config.micro_batch_size }, { label: "m", value: (r) => r.config.num_microbatches },
    { label: "recompute", value: (r) => r.config.recompute, left: true },
    { label: "schedule", value: (r) => r.config.schedule, left: true },
    { label: "weights", value: (r) => r.semantics || "synchronous", text: (r) => r.semantics === "stale" ? "stale (1 step)" : "synchronous", left: true },
    { label: "runs on", value: (r) => (r.runtimes || []).join(", "), left: true },
    { label: "step s", value: (r) => r.predicted.iteration_time_s, text: (r) => fmt(r.predicted.iteration_time_s, 3) },
    { label: "samples/s", value: (r) => r.predicted.samples_per_s, text: (r) => fmt(r.predicted.samples_per_s, 3) },
    { label: "MFU", value: (r) => r.predicted.mfu, text: (r) => pct(r.predicted.mfu) },
    { label: "bubble", value: (r) => r.predicted.bubble_fraction, text: (r) => pct(r.predicted.bubble_fraction) },
    { label: "peak GiB", value: (r) => r.predicted.peak_memory_gib, text: (r) => fmt(r.predicted.peak_memory_gib, 1) },
    { label: "cpsat", value: (r) => r.refinement ? r.refinement.status : "", left: true },
  ];
  return sortableTable("candidates", cols, rows, { index: 0, dir: 1 });
}

function scheduleTable(plan) {
  const rows = plan.by_schedule;
  return sortableTable("by-schedule", [
    { label: "schedule", value: (r) => r.schedule, left: true },
    { label: "weights", value: (r) => r.semantics || "synchronous", text: (r) => r.semantics === "stale" ? "stale (1 step)" : "synchronous", left: true },
    { label: "fit", value: (r) => r.feasible },
    { label: "best configuration", value: (r) => r.best_config ? cfgText(r.best_config) : "", left: true },
    { label: "step s", value: (r) => r.best_iteration_time_s ?? Infinity, text: (r) => fmt(r.best_iteration_time_s, 3) },
    { label: "vs best 1F1B", value: (r) => r.speedup_vs_1f1b ?? 0, text: (r) => r.speedup_vs_1f1b ? fmt(r.speedup_vs_1f1b, 3) + "×" : "–" },
  ], rows, { index: 3, dir: 1 });
}

function rejectedTable(plan) {
  if (!plan.rejected.length) return el("p", { class: "muted" }, "None (or not stored: plans list rejections only when requested with all rejections).");
  return sortableTable("rejected", [
    { label: "configuration", value: (r) => cfgText(r.config), left: true },
    { label: "peak GiB", value: (r) => r.predicted ? r.predicted.peak_memory_gib : -1, text: (r) => r.predicted ? fmt(r.predicted.peak_memory_gib, 1) : "–" },
    { label: "reason", value: (r) => r.reason, left: true },
  ], plan.rejected.slice(0, 2000), { index: 1, dir: -1 });
}

// ------------------------------------------------------------------ charts
function paretoFrontier(points) {
  const sorted = points.slice().sort((a, b) => a.x - b.x);
  const front = [];
  let best = -Infinity;
  for (const p of sorted) if (p.y > best) { front.push(p); best = p.y; }
  return front;
}

function scatter(plan, capacity) {
  const W = 600, H = 340, L = 56, B = 40, T = 14, R = 16;
  const pts = [];
  for (const c of plan.candidates) pts.push({ x: c.predicted.peak_memory_gib, y: c.predicted.samples_per_s, fit: true, label: cfgText(c.config) });
  for (const p of plan.landscape || []) pts.push({ x: p.peak_memory_gib, y: p.samples_per_s, fit: true, label: p.label, est: true });
  for (const r of plan.rejected) if (r.predicted) pts.push({ x: r.predicted.peak_memory_gib, y: r.predicted.samples_per_s, fit: false, label: cfgText(r.config) });
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", id: "scatter", role: "img" });
  if (!pts.length) return svg;
  const cap = capacity || (plan.capacity_gib ?? null);
  // Out-of-memory points can sit far to the right; keep the interesting part in view and
  // pin the rest to the right edge.
  const fitX = Math.max(0, ...pts.filter((p) => p.fit).map((p) => p.x));
  const maxX = Math.max(fitX, cap || 0) * 1.6 || Math.max(...pts.map((p) => p.x)) * 1.05 || 1;
  for (const p of pts) { if (p.x > maxX) { p.clipped = p.x; p.x = maxX; } }
  const maxY = Math.max(...pts.map((p) => p.y)) * 1.08 || 1;
  const sx = (x) => L + (x / maxX) * (W - L - R), sy = (y) => H - B - (y / maxY) * (H - B - T);
  for (let i = 0; i <= 5; i++) {
    const x = maxX * i / 5, y = maxY * i / 5;
    svg.append(svgEl("line", { x1: sx(x), x2: sx(x), y1: T, y2: H - B, stroke: "#eee" }));
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), stroke: "#eee" }));
    const tx = svgEl("text", { x: sx(x), y: H - B + 14, "text-anchor": "middle" }); tx.textContent = fmt(x, 0); svg.append(tx);
    const ty = svgEl("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end" }); ty.textContent = fmt(y, y < 10 ? 2 : 0); svg.append(ty);
  }
  const xl = svgEl("text", { x: (L + W) / 2, y: H - 6, "text-anchor": "middle" }); xl.textContent = "peak memory per device (GiB)"; svg.append(xl);
  const yl = svgEl("text", { x: 12, y: (T + H - B) / 2, transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle" }); yl.textContent = "samples / s"; svg.append(yl);
  if (cap) {
    svg.append(svgEl("line", { x1: sx(cap), x2: sx(cap), y1: T, y2: H - B, stroke: "#b42318", "stroke-dasharray": "5 4", id: "capacity-line" }));
    const t = svgEl("text", { x: sx(cap) - 4, y: T + 10, "text-anchor": "end", fill: "#b42318" }); t.textContent = `usable ${fmt(cap, 1)} GiB`; svg.append(t);
  }
  const front = paretoFrontier(pts.filter((p) => p.fit));
  if (front.length) {
    let d = `M ${sx(front[0].x)} ${sy(front[0].y)}`;
    for (let i = 1; i < front.length; i++) d += ` H ${sx(front[i].x)} V ${sy(front[i].y)}`;
    svg.append(svgEl("path", { d, fill: "none", stroke: "#2f5fd0", "stroke-width": 1.5, id: "frontier" }));
  }
  for (const p of pts) {
    const shape = p.fit
      ? svgEl("circle", { cx: sx(p.x), cy: sy(p.y), r: p.est ? 2.5 : 4, fill: p.est ? "#9db4e8" : "#2f5fd0", "fill-opacity": p.est ? 0.6 : 0.9, class: "pt-fit" })
      : svgEl("path", { d: `M ${sx(p.x) - 3} ${sy(p.y) - 3} l 6 6 m 0 -6 l -6 6`, stroke: "#b42318", "stroke-opacity": 0.5, class: "pt-oom" });
    const title = svgEl("title"); title.textContent = `${p.label}: ${fmt(p.y, 3)} samples/s, ${fmt(p.clipped ?? p.x, 1)} GiB${p.fit ? "" : " (does not fit)"}`;
    shape.append(title); svg.append(shape);
  }
  const wrap = el("div", { class: "card" }, svg,
    el("div", { class: "legend" }, el("span", { style: "--c:#2f5fd0" }, "ranked candidates (simulated)"), el("span", { style: "--c:#9db4e8" }, "other configurations (estimated)"),
      el("span", { style: "--c:#b42318" }, "out of memory"), el("span", { style: "--c:#2f5fd0" }, "feasible frontier (line)")));
  return wrap;
}

function memoryBars(best, capacity) {
  const rows = best.breakdown;
  const parts = [["parameters_gib", "params", "parameters"], ["gradients_gib", "grads", "gradients"], ["optimizer_gib", "optim", "optimizer"], ["activations_gib", "act", "activations"], ["allowance_gib", "allow", "allowance"]];
  const total = (r) => parts.reduce((s, [k]) => s + r[k], 0);
  const maxX = Math.max(capacity || 0, ...rows.map(total)) * 1.05;
  const W = 600, rowH = 18, L = 70, R = 50, T = 8;
  const H = T + rows.length * (rowH + 4) + 26;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", id: "memory-bars" });
  const sx = (x) => L + (x / maxX) * (W - L - R);
  rows.forEach((r, i) => {
    const y = T + i * (rowH + 4);
    const label = svgEl("text", { x: L - 6, y: y + 13, "text-anchor": "end" }); label.textContent = `device ${r.device}`; svg.append(label);
    let x = 0;
    const g = svgEl("g", { class: "mem-bar", "data-device": r.device });
    for (const [k, css, name] of parts) {
      const w = sx(x + r[k]) - sx(x);
      const rect = svgEl("rect", { x: sx(x), y, width: Math.max(0, w), height: rowH, fill: `var(--${css})` });
      const t = svgEl("title"); t.textContent = `${name}: ${fmt(r[k], 2)} GiB`; rect.append(t); g.append(rect);
      x += r[k];
    }
    svg.append(g);
    const v = svgEl("text", { x: sx(x) + 4, y: y + 13 }); v.textContent = fmt(x, 1); svg.append(v);
  });
  if (capacity) svg.append(svgEl("line", { x1: sx(capacity), x2: sx(capacity), y1: 0, y2: H - 20, stroke: "#b42318", "stroke-dasharray": "5 4" }));
  return el("div", { class: "card" }, svg, el("div", { class: "legend" }, parts.map(([, css, name]) => el("span", { style: `--c:var(--${css})` }, name)),
    capacity ? el("span", { style: "--c:#b42318" }, `usable memory ${fmt(capacity, 1)} GiB`) : ""));
}

// ------------------------------------------------------------------ Gantt
async function loadTimeline(id, box) {
  const { status, body } = await api(`/v1/plans/${id}/timeline?candidate=0`);
  if (status !== 200) return box.replaceChildren(el("div", { class: "banner bad" }, problemText(body)));
  box.replaceChildren(body.mode === "summary" ? timelineSummary(body) : gantt(body));
}

// A schedule too large to simulate action by action: each device's time, as the server
// summarised it (the step is priced like the plan: warm-up and steady state simulated).
function timelineSummary(timeline) {
  const rows = timeline.devices.map((d) => el("tr", {},
    el("td", {}, String(d.device)), el("td", {}, d.stages.join(",")),
    el("td", {}, fmt(d.forward_s, 3)), el("td", {}, fmt(d.backward_s, 3)), el("td", {}, fmt(d.weight_s, 3)),
    el("td", {}, fmt(d.busy_s, 3)), el("td", {}, fmt(d.idle_s, 3))));
  return el("div", { class: "card", id: "timeline-summary" },
    el("div", { class: "muted" }, `${timeline.num_actions} actions: too many to draw; per device over the step (makespan ${fmt(timeline.makespan, 3)} s, bubble ${pct(timeline.bubble_fraction)})`),
    el("table", {}, el("tr", {}, ...["device", "stages", "forward s", "backward s", "weight s", "busy s", "idle s"].map((h) => el("th", {}, h))), ...rows));
}

function gantt(timeline) {
  const devices = timeline.devices;
  const makespan = timeline.makespan;
  const canvas = el("canvas", { id: "gantt", height: Math.max(120, devices.length * 22 + 30) });
  const tip = el("div", { class: "muted", id: "gantt-tip" }, "Scroll to zoom, drag to pan; hover an action for its details.");
  let view = { from: 0, to: makespan };
  const L = 62;
  function draw() {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 1000;
    const rowH = Math.max(6, Math.min(20, (canvas.height / ratio - 24) / devices.length));
    canvas.width = width * ratio; canvas.height = (devices.length * rowH + 24) * ratio;
    canvas.style.height = (devices.length * rowH + 24) + "px";
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, devices.length * rowH + 24);
    const span = view.to - view.from;
    const sx = (t) => L + ((t - view.from) / span) * (width - L - 8);
    ctx.font = "11px system-ui"; ctx.textBaseline = "middle";
    devices.forEach((dev, row) => {
      const y = row * rowH;
      ctx.fillStyle = "#333"; ctx.fillText(`dev ${dev.device}`, 4, y + rowH / 2);
      for (const a of dev.actions) {
        const [kind, stage, mb, s, e] = a;
        if (e < view.from || s > view.to) continue;
        const x0 = Math.max(L, sx(s)), x1 = Math.min(width - 8, sx(e));
        const transfer = kind === "EVICT" || kind === "LOAD";
        ctx.fillStyle = COLORS[kind] || "#999";
        const h = transfer ? rowH * 0.35 : rowH - 2;
        ctx.fillRect(x0, y + (transfer ? rowH - h - 1 : 1), Math.max(1, x1 - x0 - 0.5), h);
        if (x1 - x0 > 16 && !transfer) { ctx.fillStyle = "#fff"; ctx.fillText(String(mb), x0 + 2, y + rowH / 2); }
      }
    });
    ctx.fillStyle = "#555";
    const axisY = devices.length * rowH + 12;
    for (let i = 0; i <= 8; i++) {
      const t = view.from + span * i / 8;
      ctx.fillText(fmt(t * (timeline.unit_scale || 1), 2) + (timeline.unit || " s"), sx(t) - 10, axisY);
    }
    canvas.dataset.rowH = rowH;
  }
  // What the chart shows, for people reading the page source and for the browser tests.
  canvas.dataset.actionsPerDevice = JSON.stringify(devices.map((d) => d.actions.length));
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const frac = Math.min(1, Math.max(0, (ev.clientX - rect.left - L) / (rect.width - L - 8)));
    const at = view.from + frac * (view.to - view.from);
    const factor = ev.deltaY < 0 ? 0.8 : 1.25;
    const span = Math.min(makespan, Math.max(makespan / 2000, (view.to - view.from) * factor));
    view.from = Math.max(0, at - frac * span); view.to = Math.min(makespan, view.from + span);
    draw();
  }, { passive: false });
  let drag = null;
  canvas.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, from: view.from, to: view.to }; });
  window.addEventListener("mouseup", () => { drag = null; });
  canvas.addEventListener("mousemove", (ev) => {
    const rect = canvas.getBoundingClientRect();
    const span = view.to - view.from;
    if (drag) {
      const dt = -(ev.clientX - drag.x) / (rect.width - L - 8) * span;
      view.from = Math.max(0, Math.min(makespan - span, drag.from + dt)); view.to = view.from + span; draw(); return;
    }
    const rowH = Number(canvas.dataset.rowH || 20);
    const row = Math.floor((ev.clientY - rect.top) / rowH);
    const t = view.from + ((ev.clientX - rect.left - L) / (rect.width - L - 8)) * span;
    const dev = devices[row];
    if (!dev) return;
    const hit = dev.actions.find((a) => a[3] <= t && t <= a[4]);
    if (hit) tip.textContent = `device ${dev.device}: ${hit[0]} of stage ${hit[1]}, micro-batch ${hit[2]}, ${fmt(hit[3], 4)} – ${fmt(hit[4], 4)} s`;
  });
  const tools = el("div", { class: "gantt-tools" },
    el("button", { onclick: () => { const c = (view.from + view.to) / 2, s = (view.to - view.from) * 0.5; view.from = Math.max(0, c - s / 2); view.to = Math.min(makespan, c + s / 2); draw(); } }, "zoom in"),
    el("button", { onclick: () => { const c = (view.from + view.to) / 2, s = Math.min(makespan, (view.to - view.from) * 2); view.from = Math.max(0, c - s / 2); view.to = Math.min(makespan, view.from + s); draw(); } }, "zoom out"),
    el("button", { onclick: () => { view = { from: 0, to: makespan }; draw(); } }, "whole step"),
    el("span", { class: "muted" }, `makespan ${fmt(makespan, 3)} s, bubble ${pct(timeline.bubble_fraction)}; ${devices.map((d) => d.actions.length).reduce((a, b) => a + b, 0)} actions` + (timeline.truncated ? ` (the first ${timeline.devices.map((d) => d.actions.length).reduce((a, b) => a + b, 0)} of the step; the rest from ${fmt(timeline.next_start_s, 3)} s on)` : "")),
  );
  const legend = el("div", { class: "legend" }, KINDS.map((k) => el("span", { style: `--c:${COLORS[k]}` }, { F: "forward", B: "backward (input)", W: "backward (weights)", BW: "backward", EVICT: "evict", LOAD: "load", STEP: "optimizer step" }[k])));
  const box = el("div", { class: "card" }, tools, canvas, legend, tip);
  requestAnimationFrame(draw);
  window.addEventListener("resize", draw);
  return box;
}

// ------------------------------------------------------------------ launch artefacts
function launchBlock(id, best) {
  const limits = Object.entries(best.runtime_limits || {}).map(([runtime, why]) => `${runtime}: ${why}`);
  const items = [
    ["torchrun (one command per node)", (best.launch.torchrun || []).join("\n")],
    ["Megatron-LM arguments", best.launch.megatron_args || "(Megatron-LM has no such schedule or split)"],
    ["torch.distributed.pipelining CSV", best.launch.torch_pipelining_csv || "(not expressible in that runtime)"],
    ["executor config (stagewright run CONFIG.json)", JSON.stringify(best.launch.executor_config, null, 1)],
  ];
  const download = el("p", {},
    el("a", { id: "launch-archive", href: `/v1/plans/${id}/launch.tar.gz`, download: `stagewright-plan-${id}.tar.gz` },
      "Download every candidate's launch files (.tar.gz)"),
    " — the executor config, a torchrun script per node, Megatron-LM arguments and the torch CSV, as stagewright plan --emit writes them.",
    el("br"), `Runs as planned on: ${(best.runtimes || []).join(", ") || "none"}` + (limits.length ? ` (not on ${limits.join("; ")})` : ""));
  return el("div", {}, download, items.map(([title, text], i) => el("div", { class: "artefact card" },
    el("b", {}, title),
    el("button", { class: "copy", "data-copy": i, onclick: (ev) => copy(text, ev.target) }, "copy"),
    el("pre", {}, text.length > 20000 ? text.slice(0, 20000) + "\n… (copy gets all of it)" : text))));
}
async function copy(text, button) {
  try { await navigator.clipboard.writeText(text); button.textContent = "copied"; }
  catch { const area = el("textarea"); area.value = text; document.body.append(area); area.select(); document.execCommand("copy"); area.remove(); button.textContent = "copied"; }
  setTimeout(() => { button.textContent = "copy"; }, 1500);
}

// ------------------------------------------------------------------ request form
// The form's preset: data, not a rule (the registry at /v1/schedules lists every schedule).
const PRESET_SCHEDULES = ["1f1b", "bpipe", "v-half", "v-zb"];
async function showForm() {
  const hw = await api("/v1/hardware");
  const names = hw.status === 200 ? (hw.body.items || hw.body).map((h) => h.name) : ["a100-sxm-80g", "cpu"];
  const registry = await api("/v1/schedules");
  const schedules = registry.status === 200 ? registry.body : PRESET_SCHEDULES.map((name) => ({ name, title: name }));
  const field = (label, name, input) => el("div", { class: "row", "data-field": name }, el("label", { for: name }, label), el("div", {}, input, el("div", { class: "error", "data-error": name })));
  const num = (name, value, min = 1) => el("input", { type: "number", id: name, name, value, min });
  const form = el("form", { id: "plan-form", novalidate: "" },
    el("fieldset", {}, el("legend", {}, "Model"),
      field("name", "model.name", el("input", { type: "text", id: "model.name", value: "gpt3-13b" })),
      field("layers", "model.num_layers", num("model.num_layers", 40)),
      field("hidden size", "model.hidden_size", num("model.hidden_size", 5120)),
      field("attention heads", "model.num_attention_heads", num("model.num_attention_heads", 40)),
      field("sequence length", "model.seq_length", num("model.seq_length", 2048)),
      field("vocabulary", "model.vocab_size", num("model.vocab_size", 51200))),
    el("fieldset", {}, el("legend", {}, "Cluster"),
      field("GPU", "cluster.gpu", el("select", { id: "cluster.gpu" }, names.map((n) => el("option", { value: n, selected: n === "a100-sxm-80g" ? "" : null }, n)))),
      field("nodes", "cluster.num_nodes", num("cluster.num_nodes", 1)),
      field("GPUs per node", "cluster.gpus_per_node", num("cluster.gpus_per_node", 8))),
    el("fieldset", {}, el("legend", {}, "Training"),
      field("global batch size", "training.global_batch_size", num("training.global_batch_size", 32)),
      field("precision", "training.precision", el("select", { id: "training.precision" }, ["bf16", "fp16", "fp32"].map((p) => el("option", { value: p }, p)))),
      field("distributed optimizer", "training.distributed_optimizer", el("input", { type: "checkbox", id: "training.distributed_optimizer", checked: "" })),
      field("sequence parallel", "training.sequence_parallel", el("input", { type: "checkbox", id: "training.sequence_parallel", checked: "" })),
      field("flash attention", "training.flash_attention", el("input", { type: "checkbox", id: "training.flash_attention" }))),
    el("fieldset", {}, el("legend", {}, "Search"),
      field("schedules", "search.schedules", el("div", { class: "checks", id: "search.schedules" }, schedules.map((f) => el("label", { title: f.title }, el("input", { type: "checkbox", value: f.name, checked: PRESET_SCHEDULES.includes(f.name) ? "" : null }), " " + f.name)))),
      field("recompute", "search.recompute", el("div", { class: "checks", id: "search.recompute" }, ["none", "selective", "full"].map((s) => el("label", {}, el("input", { type: "checkbox", value: s, checked: "" }), " " + s)))),
      field("method", "search.method", el("select", { id: "search.method" }, ["grid", "cpsat"].map((m) => el("option", { value: m }, m)))),
      field("top k", "search.top_k", num("search.top_k", 10))),
    el("div", { class: "banner bad", id: "form-error", hidden: "" }),
    el("button", { class: "primary", type: "submit", id: "submit" }, "Plan it"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); submitForm(form); });
  app.replaceChildren(el("h1", {}, "Plan a run"), el("p", { class: "muted" }, "The planner searches tensor, pipeline and data parallelism, micro-batch size, recomputation and the schedule, and shows why it chose what it chose."), form);
}

function readForm() {
  const v = (id) => document.getElementById(id);
  const n = (id) => v(id).value === "" ? null : Number(v(id).value);
  const checks = (id) => [...v(id).querySelectorAll("input:checked")].map((i) => i.value);
  return {
    model: { name: v("model.name").value, num_layers: n("model.num_layers"), hidden_size: n("model.hidden_size"), num_attention_heads: n("model.num_attention_heads"), seq_length: n("model.seq_length"), vocab_size: n("model.vocab_size") },
    cluster: { gpu: v("cluster.gpu").value, num_nodes: n("cluster.num_nodes"), gpus_per_node: n("cluster.gpus_per_node") },
    training: { global_batch_size: n("training.global_batch_size"), precision: v("training.precision").value, optimizer: "adam", distributed_optimizer: v("training.distributed_optimizer").checked, sequence_parallel: v("training.sequence_parallel").checked, flash_attention: v("training.flash_attention").checked },
    search: { schedules: checks("search.schedules"), recompute: checks("search.recompute"), method: v("search.method").value, top_k: n("search.top_k") },
  };
}

async function submitForm(form) {
  for (const e of form.querySelectorAll("[data-error]")) e.textContent = "";
  for (const r of form.querySelectorAll(".field-error")) r.classList.remove("field-error");
  const banner = document.getElementById("form-error");
  banner.hidden = true;
  const button = document.getElementById("submit");
  button.disabled = true; button.textContent = "Planning…";
  const { status, headers, body } = await api("/v1/plans", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(readForm()) });
  button.disabled = false; button.textContent = "Plan it";
  if (status === 200 || status === 201) { location.hash = `#/plans/${body.id}`; return; }
  if (status === 202) { const loc = headers.get("Location") || ""; location.hash = "#" + loc.replace(/^\/v1/, "").replace(/^\/?/, "/"); return; }
  let placed = false;
  for (const err of (body && (body.errors || body.invalid_params)) || []) {
    const loc = (err.loc || err.location || []).filter((x) => x !== "body").join(".");
    const target = form.querySelector(`[data-error="${loc}"]`) || form.querySelector(`[data-error="${loc.split(".").slice(0, 2).join(".")}"]`);
    if (target) { target.textContent = err.msg || err.message || err.reason; target.closest(".row").classList.add("field-error"); placed = true; }
  }
  banner.textContent = problemText(body) + (placed ? " (see the marked fields)" : "");
  banner.hidden = false;
}

// ------------------------------------------------------------------ memory limits
// Bubble rate against memory limit of the adaptive schedules (V-shape paper, Figs. 9, 10).
const SWEEP_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
async function showMemorySweep() {
  const num = (name, value, step = "any") => el("input", { type: "number", id: name, value, step, min: 0 });
  const row = (label, input) => el("div", { class: "row" }, el("label", { for: input.id }, label), el("div", {}, input));
  const form = el("form", { id: "sweep-form", novalidate: "" },
    el("fieldset", {}, el("legend", {}, "Pipeline (times of one V stage, ms: Table 5, 9.6B, micro-batch 4)"),
      row("devices", num("sweep.devices", 8, 1)), row("micro-batches", num("sweep.microbatches", 32, 1)),
      row("F", num("sweep.f", 12.96)), row("B", num("sweep.b", 13.22)), row("W", num("sweep.w", 9.76)), row("communication", num("sweep.comm", 0))),
    el("div", { class: "banner bad", id: "sweep-error", hidden: "" }),
    el("button", { class: "primary", type: "submit", id: "sweep-submit" }, "Sweep"));
  const chart = el("div", { id: "sweep-chart" });
  form.addEventListener("submit", (ev) => { ev.preventDefault(); runSweep(chart); });
  app.replaceChildren(el("h1", {}, "Memory limits"), el("p", { class: "muted" }, "The fewest bubbles each schedule built for a memory limit reaches under each activation memory limit, a fraction of 1F1B's peak (zb-adaptive at 1 is ZB-1P, at 2 ZB-2P); 1F1B, which has no limit to set, is the reference. Schedules with one stage a device run two V stages' times per stage."), form, chart);
  runSweep(chart);
}
async function runSweep(chart) {
  const v = (id) => Number(document.getElementById(id).value);
  const body = { num_devices: v("sweep.devices"), num_microbatches: v("sweep.microbatches"), forward: v("sweep.f"), backward: v("sweep.b"), weight: v("sweep.w"), comm: v("sweep.comm") };
  const banner = document.getElementById("sweep-error");
  banner.hidden = true;
  chart.replaceChildren(el("p", { class: "muted" }, "Searching every limit…"));
  const { status, body: result } = await api("/v1/simulate/memory-sweep", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  if (status !== 200) { banner.textContent = problemText(result); banner.hidden = false; chart.replaceChildren(); return; }
  chart.replaceChildren(sweepChart(result), sweepTable(result));
}
function sweepChart(sweep) {
  const W = 640, H = 360, L = 60, R = 150, T = 20, B = 44;
  const xs = sweep.points.map((p) => p.memory_limit);
  const series = sweep.schedules.map((name, i) => [name, SWEEP_PALETTE[i % SWEEP_PALETTE.length]]);
  const ys = [sweep.reference_bubble, ...sweep.points.flatMap((p) => sweep.schedules.map((name) => p.bubble[name]).filter((y) => y !== null))];
  const xMax = Math.max(1, ...xs), yMax = Math.max(0.05, ...ys) * 1.1;
  const x = (v) => L + v / xMax * (W - L - R), y = (v) => H - B - v / yMax * (H - T - B);
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: "sweep-svg", class: "chart" });
  svg.append(svgEl("line", { x1: x(0), y1: y(0), x2: x(xMax), y2: y(0), stroke: "currentColor" }), svgEl("line", { x1: x(0), y1: y(0), x2: x(0), y2: y(yMax), stroke: "currentColor" }));
  for (let k = 0; k <= 5; k++) {
    const tx = svgEl("text", { x: x(xMax * k / 5), y: y(0) + 16, "text-anchor": "middle" }); tx.textContent = fmt(xMax * k / 5); svg.append(tx);
    const ty = svgEl("text", { x: x(0) - 6, y: y(yMax * k / 5) + 4, "text-anchor": "end" }); ty.textContent = fmt(yMax * k / 5); svg.append(ty);
  }
  const xl = svgEl("text", { x: (x(0) + x(xMax)) / 2, y: H - 8, "text-anchor": "middle" }); xl.textContent = "activation memory limit (fraction of 1F1B's peak)"; svg.append(xl);
  const yl = svgEl("text", { transform: `translate(14 ${(y(0) + y(yMax)) / 2}) rotate(-90)`, "text-anchor": "middle" }); yl.textContent = "bubble rate"; svg.append(yl);
  svg.append(svgEl("line", { class: "series", "data-series": sweep.reference, x1: x(0), y1: y(sweep.reference_bubble), x2: x(xMax), y2: y(sweep.reference_bubble), stroke: "#7f7f7f", "stroke-dasharray": "6 4" }));
  const legend = [[sweep.reference, "#7f7f7f"]];
  for (const [label, colour] of series) {
    const pts = sweep.points.filter((p) => p.bubble[label] !== null).map((p) => [x(p.memory_limit), y(p.bubble[label])]);
    svg.append(svgEl("polyline", { class: "series", "data-series": label, points: pts.map((p) => p.join(",")).join(" "), fill: "none", stroke: colour, "stroke-width": 2 }));
    for (const [px, py] of pts) svg.append(svgEl("circle", { cx: px, cy: py, r: 3, fill: colour }));
    legend.push([label, colour]);
  }
  legend.forEach(([label, colour], i) => {
    svg.append(svgEl("rect", { x: W - R + 16, y: T + 16 * i, width: 12, height: 3, fill: colour }));
    const t = svgEl("text", { x: W - R + 34, y: T + 16 * i + 5 }); t.textContent = label; svg.append(t);
  });
  return svg;
}
function sweepTable(sweep) {
  const heads = ["memory limit", ...sweep.schedules.flatMap((name) => [`${name} bubble`, "its peak"])];
  return el("table", { id: "sweep-table" },
    el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, sweep.points.map((p) => el("tr", {}, [fmt(p.memory_limit, 3), ...sweep.schedules.flatMap((name) => [pct(p.bubble[name]), fmt(p.peak[name], 3)])].map((c) => el("td", {}, c))))));
}

// ------------------------------------------------------------------ hardware and profiles
async function showHardware() {
  const [hw, prof] = await Promise.all([api("/v1/hardware"), api("/v1/profiles")]);
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
