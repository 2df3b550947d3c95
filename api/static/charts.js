// Charts of a plan: throughput against peak memory (every candidate, out-of-memory ones at
// their real value on a broken axis), memory per device, and memory over the step.
"use strict";

const MEMORY_PARTS = [["parameters", "params", "parameters"], ["gradients", "grads", "gradients"], ["optimizer", "optim", "optimizer states"], ["activations", "act", "activations"], ["allowance", "allow", "allowance"]];
const DEVICE_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

function svgText(svg, x, y, text, attrs = {}) {
  const t = svgEl("text", { x, y, ...attrs }); t.textContent = text; svg.append(t); return t;
}
function tickText(value, step) { return value.toFixed(stepDecimals(step)); }
// Ticks of a logarithmic axis over [lo, hi]: 1, 2 and 5 x 10^k inside the range.
function logTicks(lo, hi) {
  const out = [];
  for (let k = Math.floor(Math.log10(lo)); k <= Math.ceil(Math.log10(hi)); k++) for (const f of [1, 2, 5]) {
    const v = f * Math.pow(10, k);
    if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push(+v.toPrecision(6));
  }
  return out;
}

// Throughput against peak memory per device. Configurations that fit are drawn on a linear
// axis up to a little past the usable memory; out-of-memory ones beyond it are drawn at
// their real value in a separate, shaded band after an axis break (logarithmic when they
// span more than a factor of 8). `onPick(kind, index)` selects a point's candidate.
function scatter(plan, capacity, onPick) {
  const W = 600, H = 350, L = 56, B = 40, T = 26, R = 16;
  const pts = [];
  plan.candidates.forEach((c, i) => pts.push({ x: c.predicted.peak_memory_gib, y: c.predicted.samples_per_s, fit: true, label: cfgText(c.config), pick: ["candidates", i + 1] }));
  for (const p of plan.landscape || []) pts.push({ x: p.peak_memory_gib, y: p.samples_per_s, fit: true, label: p.label, est: true });
  plan.rejected.forEach((r, i) => { if (r.predicted) pts.push({ x: r.predicted.peak_memory_gib, y: r.predicted.samples_per_s, fit: false, label: cfgText(r.config), pick: ["rejected", i + 1] }); });
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", id: "scatter", role: "img" });
  if (!pts.length) return el("div", { class: "card" }, svg);
  const cap = capacity || null;
  const fitMax = Math.max(0, ...pts.filter((p) => p.fit).map((p) => p.x));
  const main = niceAxis(0, Math.max(fitMax, cap || 0, 1e-3) * 1.08, 5);
  const mainMax = main.ticks[main.ticks.length - 1];
  const beyond = pts.filter((p) => p.x > mainMax);
  const gap = 16;
  const mainW = beyond.length ? (W - L - R) * 0.68 : W - L - R;
  const bandX0 = L + mainW + gap, bandX1 = W - R;
  let bandScale = null, bandTicks = [], bandLog = false;
  if (beyond.length) {
    const lo = Math.min(...beyond.map((p) => p.x)), hi = Math.max(...beyond.map((p) => p.x));
    bandLog = hi / lo > 8;
    if (bandLog) {
      const a = Math.log10(lo) - 0.05, b = Math.log10(hi) + 0.05;
      bandScale = (x) => bandX0 + 6 + (Math.log10(x) - a) / (b - a) * (bandX1 - bandX0 - 12);
      bandTicks = logTicks(Math.pow(10, a), Math.pow(10, b)).filter((v) => bandScale(v) > bandX0 + 14);
    } else {
      const t = niceTicks(lo, hi, 3);
      const a = Math.min(lo, t.ticks[0]) - t.step * 0.25, b = Math.max(hi, t.ticks[t.ticks.length - 1]) + t.step * 0.25;
      bandScale = (x) => bandX0 + 6 + (x - a) / (b - a) * (bandX1 - bandX0 - 12);
      bandTicks = t.ticks.filter((v) => v >= a && v <= b);
    }
  }
  const yt = niceAxis(0, Math.max(...pts.map((p) => p.y)) * 1.05 || 1, 5);
  const maxY = yt.ticks[yt.ticks.length - 1];
  const sxMain = (x) => L + (x / mainMax) * mainW;
  const sx = (x) => x > mainMax ? bandScale(x) : sxMain(x);
  const sy = (y) => H - B - (y / maxY) * (H - B - T);
  if (beyond.length) {
    svg.append(svgEl("rect", { x: bandX0, y: T, width: bandX1 - bandX0, height: H - B - T, fill: "#fdecec", id: "oom-band" }));
    svgText(svg, (bandX0 + bandX1) / 2, T - 8, bandLog ? "out of memory (log scale)" : "out of memory", { "text-anchor": "middle", fill: "#b42318" });
    // The break: two slanted strokes across the axis between the two scales.
    for (const dx of [-3, 3]) svg.append(svgEl("line", { x1: L + mainW + gap / 2 + dx - 3, y1: H - B + 5, x2: L + mainW + gap / 2 + dx + 3, y2: H - B - 5, stroke: "#444" }));
  }
  for (const x of main.ticks) {
    svg.append(svgEl("line", { x1: sxMain(x), x2: sxMain(x), y1: T, y2: H - B, stroke: "#eee" }));
    svgText(svg, sxMain(x), H - B + 14, tickText(x, main.step), { "text-anchor": "middle", class: "tick-x", "data-value": x });
  }
  for (const x of bandTicks) {
    svg.append(svgEl("line", { x1: bandScale(x), x2: bandScale(x), y1: T, y2: H - B, stroke: "#f4caca" }));
    svgText(svg, bandScale(x), H - B + 14, String(x), { "text-anchor": "middle", class: "tick-x tick-band", "data-value": x });
  }
  for (const y of yt.ticks) {
    svg.append(svgEl("line", { x1: L, x2: L + mainW, y1: sy(y), y2: sy(y), stroke: "#eee" }));
    svgText(svg, L - 6, sy(y) + 4, tickText(y, yt.step), { "text-anchor": "end", class: "tick-y", "data-value": y });
  }
  svg.append(svgEl("line", { x1: L, x2: L + mainW, y1: H - B, y2: H - B, stroke: "#444" }));
  if (beyond.length) svg.append(svgEl("line", { x1: bandX0, x2: bandX1, y1: H - B, y2: H - B, stroke: "#444" }));
  svgText(svg, (L + W) / 2, H - 6, "peak memory per device (GiB)", { "text-anchor": "middle" });
  svgText(svg, 12, (T + H - B) / 2, "samples / s", { transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle" });
  if (cap) {
    svg.append(svgEl("line", { x1: sxMain(cap), x2: sxMain(cap), y1: T, y2: H - B, stroke: "#b42318", "stroke-dasharray": "5 4", id: "capacity-line" }));
    svgText(svg, sxMain(cap), T - 8, `usable ${fmt(cap, 1)} GiB`, { "text-anchor": "middle", fill: "#b42318" });
  }
  const front = paretoFrontier(pts.filter((p) => p.fit));
  if (front.length) {
    let d = `M ${sx(front[0].x)} ${sy(front[0].y)}`;
    for (let i = 1; i < front.length; i++) d += ` H ${sx(front[i].x)} V ${sy(front[i].y)}`;
    svg.append(svgEl("path", { d, fill: "none", stroke: "#2f5fd0", "stroke-width": 1.5, id: "frontier" }));
  }
  const pickable = [];
  for (const p of pts) {
    const x = sx(p.x), y = sy(p.y);
    const rank = p.pick ? `${p.pick[0] === "candidates" ? "#" : "rejected #"}${p.pick[1]} ` : "";
    const text = `${rank}${p.label}: ${fmt(p.y, 3)} samples/s, ${fmt(p.x, 1)} GiB${p.fit ? "" : " (does not fit)"}`;
    const opens = p.pick && onPick;
    const pick = opens ? { role: "link", "aria-label": `${text}; opens its details`, "data-pick": p.pick.join("/"), tabindex: -1 } : {};
    const kind = (p.fit ? (p.est ? "pt-fit pt-est" : "pt-fit pt-ranked") : "pt-oom") + (opens ? " pt-pick" : "");
    const shape = p.fit
      ? svgEl("circle", { cx: x, cy: y, r: p.est ? 2.5 : 4, fill: p.est ? "#9db4e8" : "#2f5fd0", "fill-opacity": p.est ? 0.6 : 0.9, class: kind, ...pick })
      : svgEl("path", { d: `M ${x - 3} ${y - 3} l 6 6 m 0 -6 l -6 6`, stroke: "#b42318", "stroke-opacity": 0.6, class: kind, "data-gib": p.x, "data-x": x.toFixed(2), ...pick });
    const title = svgEl("title"); title.textContent = text + (p.pick ? " — click to inspect" : "");
    shape.append(title);
    if (opens) {
      shape.style.cursor = "pointer";
      shape.addEventListener("click", () => onPick(...p.pick));
      pickable.push({ shape, x, y, pick: p.pick });
    }
    svg.append(shape);
  }
  pointKeyboard(svg, pickable, onPick);
  const swatch = (draw) => { const s = svgEl("svg", { width: 22, height: 10, class: "swatch" }); s.append(draw); return s; };
  const legend = el("div", { class: "legend lines", id: "scatter-legend" },
    el("span", {}, swatch(svgEl("circle", { cx: 11, cy: 5, r: 4, fill: "#2f5fd0" })), "ranked candidates (simulated)"),
    (plan.landscape || []).length ? el("span", {}, swatch(svgEl("circle", { cx: 11, cy: 5, r: 2.5, fill: "#9db4e8" })), "other configurations (estimated)") : "",
    beyond.length || pts.some((p) => !p.fit) ? el("span", {}, swatch(svgEl("path", { d: "M 8 2 l 6 6 m 0 -6 l -6 6", stroke: "#b42318" })), "out of memory") : "",
    front.length ? el("span", { "data-legend": "frontier" }, swatch(svgEl("line", { x1: 1, y1: 5, x2: 21, y2: 5, stroke: "#2f5fd0", "stroke-width": 1.5 })), "best throughput for its memory (frontier)") : "",
    cap ? el("span", {}, swatch(svgEl("line", { x1: 1, y1: 5, x2: 21, y2: 5, stroke: "#b42318", "stroke-dasharray": "4 3" })), "usable memory") : "");
  return el("div", { class: "card" }, svg, legend);
}

// The chart is one stop in the Tab order (the first ranked candidate, else the first point
// that opens anything); the arrow keys move along the points as drawn, left to right (Home
// and End to the ends), and Enter or Space opens the focused one, as clicking it does. A
// stop per point would make a keyboard user tab through hundreds of rejected ones.
function pointKeyboard(svg, pickable, onPick) {
  if (!pickable.length) return;
  svg.setAttribute("role", "group");
  svg.setAttribute("aria-label", "Throughput against peak memory per device; arrow keys move between configurations, Enter opens one");
  const order = pickable.slice().sort((a, b) => a.x - b.x || b.y - a.y);
  const first = order.find((p) => p.pick[0] === "candidates" && p.pick[1] === 1) || order[0];
  first.shape.setAttribute("tabindex", 0);
  const moves = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };
  order.forEach((p, i) => p.shape.addEventListener("keydown", (e) => {
    let next = null;
    if (e.key in moves) next = order[Math.min(order.length - 1, Math.max(0, i + moves[e.key]))];
    else if (e.key === "Home") next = order[0];
    else if (e.key === "End") next = order[order.length - 1];
    else if (e.key === "Enter" || e.key === " ") { e.preventDefault(); onPick(...p.pick); return; }
    else return;
    e.preventDefault();
    p.shape.setAttribute("tabindex", -1);
    next.shape.setAttribute("tabindex", 0);
    next.shape.focus();
  }));
}

function paretoFrontier(points) {
  const sorted = points.slice().sort((a, b) => a.x - b.x);
  const front = [];
  let best = -Infinity;
  for (const p of sorted) if (p.y > best) { front.push(p); best = p.y; }
  return front;
}

// Stacked bars, one per pipeline device: rows are {device, parameters, gradients,
// optimizer, activations, allowance} in GiB.
function memoryBars(rows, capacity, id = "memory-bars") {
  const total = (r) => MEMORY_PARTS.reduce((s, [k]) => s + r[k], 0);
  const xt = niceAxis(0, Math.max(capacity || 0, ...rows.map(total)) * 1.04 || 1, 5);
  const maxX = xt.ticks[xt.ticks.length - 1];
  const W = 600, rowH = rows.length > 16 ? 10 : 18, L = 70, R = 50, T = 8;
  const H = T + rows.length * (rowH + 4) + 30;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", id });
  const sx = (x) => L + (x / maxX) * (W - L - R);
  const axisY = T + rows.length * (rowH + 4);
  for (const x of xt.ticks) {
    svg.append(svgEl("line", { x1: sx(x), x2: sx(x), y1: T, y2: axisY, stroke: "#eee" }));
    svgText(svg, sx(x), axisY + 13, tickText(x, xt.step), { "text-anchor": "middle", class: "tick-x", "data-value": x });
  }
  svgText(svg, (L + W - R) / 2, H - 3, "GiB per device", { "text-anchor": "middle" });
  rows.forEach((r, i) => {
    const y = T + i * (rowH + 4);
    svgText(svg, L - 6, y + rowH / 2 + 4, `device ${r.device}`, { "text-anchor": "end" });
    let x = 0;
    const g = svgEl("g", { class: "mem-bar", "data-device": r.device, "data-total": total(r).toFixed(3) });
    for (const [k, css, name] of MEMORY_PARTS) {
      const rect = svgEl("rect", { x: sx(x), y, width: Math.max(0, sx(x + r[k]) - sx(x)), height: rowH, fill: `var(--${css})` });
      const t = svgEl("title"); t.textContent = `device ${r.device}, ${name}: ${fmt(r[k], 2)} GiB`; rect.append(t); g.append(rect);
      x += r[k];
    }
    svg.append(g);
    const over = capacity && x > capacity;
    svgText(svg, Math.min(sx(x) + 4, W - R + 2), y + rowH / 2 + 4, fmt(x, 1), over ? { fill: "#b42318", "font-weight": 600 } : {});
  });
  if (capacity) svg.append(svgEl("line", { x1: sx(capacity), x2: sx(capacity), y1: 0, y2: axisY, stroke: "#b42318", "stroke-dasharray": "5 4", class: "capacity" }));
  return el("div", { class: "card" }, svg, el("div", { class: "legend" }, MEMORY_PARTS.map(([, css, name]) => el("span", { style: `--c:var(--${css})` }, name)),
    capacity ? el("span", { style: "--c:#b42318" }, `usable memory ${fmt(capacity, 1)} GiB`) : ""));
}

// Each device's memory over the simulated step (static memory plus the activations saved at
// each moment), as steps; the usable memory dashed.
function memoryOverTime(timeline, capacity) {
  const devices = timeline.devices.filter((d) => d.memory_curve && d.memory_curve.length);
  if (!devices.length) return el("p", { class: "muted", id: "memory-time-none" }, "The schedule is too large to simulate action by action here, so there is no curve; the bars above give each device's peak.");
  const W = 600, H = 260, L = 52, R = 16, T = 12, B = 38;
  const makespan = timeline.makespan;
  const high = Math.max(...devices.flatMap((d) => d.memory_curve.map((p) => p[1])));
  const low = Math.min(...devices.flatMap((d) => d.memory_curve.map((p) => p[1])));
  // The axis starts near the lowest level (not at 0: the weights would flatten the
  // activations' rise and fall into a line) and says so; the usable memory is drawn when it
  // is near enough to matter, else named below the chart.
  const showCap = capacity && capacity <= high + 0.5 * Math.max(high - low, 0.05 * high);
  const span = niceAxis(low, Math.max(high, showCap ? capacity : high) + 1e-9, 5);
  const yLo = span.ticks[0] <= low ? span.ticks[0] : span.ticks[0] - span.step;
  const yHi = Math.max(span.ticks[span.ticks.length - 1], high, showCap ? capacity : 0);
  const yt = niceTicks(yLo, yHi, 5);
  const xt = niceTicks(0, makespan, 6);
  const sx = (t) => L + (t / makespan) * (W - L - R), sy = (v) => H - B - ((v - yLo) / (yHi - yLo || 1)) * (H - B - T);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", id: "memory-time" });
  for (const y of yt.ticks) {
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), stroke: "#eee" }));
    svgText(svg, L - 6, sy(y) + 4, tickText(y, yt.step), { "text-anchor": "end", class: "tick-y" });
  }
  for (const x of xt.ticks) svgText(svg, Math.min(sx(x), W - R - 12), H - B + 14, tickText(x, xt.step), { "text-anchor": "middle", class: "tick-x" });
  svgText(svg, (L + W) / 2, H - 6, "time in the step (s)", { "text-anchor": "middle" });
  svgText(svg, 12, (T + H - B) / 2, yLo > 0 ? `GiB (from ${tickText(yLo, yt.step)})` : "GiB", { transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle" });
  if (showCap) svg.append(svgEl("line", { x1: L, x2: W - R, y1: sy(capacity), y2: sy(capacity), stroke: "#b42318", "stroke-dasharray": "5 4" }));
  devices.forEach((d, i) => {
    const curve = d.memory_curve;
    let path = `M ${sx(0).toFixed(1)} ${sy(curve[0][1]).toFixed(1)}`;
    for (const [t, v] of curve) path += ` H ${sx(t).toFixed(1)} V ${sy(v).toFixed(1)}`;
    path += ` H ${sx(makespan).toFixed(1)}`;
    svg.append(svgEl("path", { d: path, fill: "none", stroke: DEVICE_PALETTE[i % DEVICE_PALETTE.length], "stroke-width": 1.3, class: "mem-curve", "data-device": d.device, "data-peak": Math.max(...curve.map((p) => p[1])).toFixed(3) }));
  });
  const legend = el("div", { class: "legend" }, devices.length <= 16 ? devices.map((d, i) => el("span", { style: `--c:${DEVICE_PALETTE[i % DEVICE_PALETTE.length]}` }, `device ${d.device}`)) : el("span", { class: "muted" }, `${devices.length} devices`),
    showCap ? el("span", { style: "--c:#b42318" }, "usable memory") : "");
  return el("div", { class: "card" }, svg, legend, el("div", { class: "muted" }, `Lowest ${fmt(low, 2)} GiB (weights, gradients, optimizer states, working buffers and allowance), highest ${fmt(high, 2)} GiB: saved activations rise with each forward and fall with each backward.` + (capacity && !showCap ? ` The usable memory, ${fmt(capacity, 1)} GiB, is far above.` : "")));
}
