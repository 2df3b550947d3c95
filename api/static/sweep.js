// The Memory limits page: bubble rate against activation memory limit of the schedules built
// for a limit (V-shape paper, Figs. 9 and 10), from POST /v1/simulate/memory-sweep.
"use strict";

// ------------------------------------------------------------------ memory limits
// Bubble rate against memory limit of the adaptive schedules (V-shape paper, Figs. 9, 10).
const SWEEP_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
// The fields: input id, label, the request's key. What was typed is kept for the tab.
const SWEEP_FIELDS = [["sweep.devices", "devices", "num_devices"], ["sweep.microbatches", "micro-batches", "num_microbatches"],
  ["sweep.f", "F", "forward"], ["sweep.b", "B", "backward"], ["sweep.w", "W", "weight"], ["sweep.comm", "communication", "comm"]];
const SWEEP_DRAFT = "stagewright.sweep-form";
async function showMemorySweep() {
  const draft = readDraft(SWEEP_DRAFT) || {};
  const num = (name, value, step = "any") => el("input", { type: "number", id: name, value: typeof draft[name] === "string" ? draft[name] : value, step, min: 0 });
  const row = (label, input) => el("div", { class: "row", "data-field": input.id }, el("label", { for: input.id }, label), el("div", {}, input));
  const form = el("form", { id: "sweep-form", novalidate: "" },
    el("fieldset", {}, el("legend", {}, "Pipeline (times of one V stage, ms: Table 5, 9.6B, micro-batch 4)"),
      row("devices", num("sweep.devices", 8, 1)), row("micro-batches", num("sweep.microbatches", 32, 1)),
      row("F", num("sweep.f", 12.96)), row("B", num("sweep.b", 13.22)), row("W", num("sweep.w", 9.76)), row("communication", num("sweep.comm", 0))),
    el("div", { class: "banner bad", id: "sweep-error", hidden: "" }),
    el("button", { class: "primary", type: "submit", id: "sweep-submit" }, "Sweep"));
  const chart = el("div", { id: "sweep-chart" });
  form.addEventListener("submit", (ev) => { ev.preventDefault(); runSweep(chart); });
  form.addEventListener("input", () => {
    keepDraft(SWEEP_DRAFT, Object.fromEntries(SWEEP_FIELDS.map(([id]) => [id, document.getElementById(id).value])));
  });
  app.replaceChildren(el("h1", {}, "Memory limits"), el("p", { class: "muted" }, "The fewest bubbles each schedule built for a memory limit reaches under each activation memory limit, a fraction of 1F1B's peak (zb-adaptive at 1 is ZB-1P, at 2 ZB-2P); 1F1B, which has no limit to set, is the reference. Schedules with one stage a device run two V stages' times per stage."), form, chart);
  runSweep(chart);
}
// Marks the fields named in `problems` ([id, message]) and lists them in the banner.
function sweepErrors(problems) {
  const banner = document.getElementById("sweep-error");
  for (const [id] of problems) {
    const input = document.getElementById(id);
    if (input) markInvalid(input);
  }
  banner.textContent = problems.map(([id, msg]) => { const f = SWEEP_FIELDS.find(([i]) => i === id); return f ? `${f[1]}: ${msg}` : msg; }).join(" ");
  banner.hidden = false;
}
async function runSweep(chart) {
  const banner = document.getElementById("sweep-error");
  banner.hidden = true;
  clearInvalid(document.getElementById("sweep-form"));
  // An emptied field (or one holding what is not a number, which the browser reads as
  // empty) used to be sent as 0: F = 0 ms, drawn without a word.
  const body = {}, problems = [];
  for (const [id, , key] of SWEEP_FIELDS) {
    const input = document.getElementById(id);
    if (input.value === "" || (input.validity && input.validity.badInput)) problems.push([id, "enter a number (0 for none)"]);
    else body[key] = Number(input.value);
  }
  if (problems.length) return sweepErrors(problems);
  chart.replaceChildren(el("p", { class: "muted" }, "Searching every limit…"));
  const live = pageTicket();
  const { status, body: result } = await api("/v1/simulate/memory-sweep", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  if (!live() || !chart.isConnected) return;
  if (status !== 200) {
    // The server's errors at the fields they name, in the page's words (not body.num_devices).
    const errors = (result && result.errors) || [];
    const located = errors.map((e) => { const key = (e.loc || []).filter((x) => x !== "body").join("."); const f = SWEEP_FIELDS.find(([, , k]) => k === key); return f ? [f[0], e.msg] : null; });
    if (errors.length && located.every(Boolean)) sweepErrors(located);
    else { banner.textContent = problemText(result); banner.hidden = false; }
    chart.replaceChildren();
    return;
  }
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
  return el("div", { class: "wide" }, el("table", { id: "sweep-table" },
    el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, sweep.points.map((p) => el("tr", {}, [fmt(p.memory_limit, 3), ...sweep.schedules.flatMap((name) => [pct(p.bubble[name]), fmt(p.peak[name], 3)])].map((c) => el("td", {}, c)))))));
}
