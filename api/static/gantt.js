// The Gantt chart of one candidate's simulated schedule (GET /v1/plans/{id}/timeline):
// an overview of the whole step (busy and idle per device, the zoomed window outlined) over
// a zoomable chart of every action. A V schedule's second chunk is drawn in a lighter shade
// of each kind's colour; micro-batch numbers appear as soon as they fit in their box.
"use strict";

const KIND_NAMES = { F: "forward", B: "backward (input)", W: "backward (weights)", BW: "backward", EVICT: "evict", LOAD: "load", STEP: "optimizer step" };
const IDLE_SHADE = "#e4e6eb";
const GANTT_LEFT = 62, GANTT_RIGHT = 10;


// The chunk of a stage on its device: its place in the device's stage list (a V schedule
// holds stages d and 2p-1-d on device d; interleaved schedules hold more).
function chunkOf(device, stage) {
  const i = (device.stages || []).indexOf(stage);
  return i < 0 ? 0 : i;
}
function kindKey(kind, chunk) { return chunk > 0 && kind !== "EVICT" && kind !== "LOAD" && kind !== "STEP" ? `${kind}${chunk + 1}` : kind; }
function kindColor(key) { return COLORS[key] || COLORS[key.replace(/\d+$/, "")] || "#999"; }
function kindLabel(key, chunked) {
  const m = key.match(/^([A-Z]+)(\d*)$/);
  const name = KIND_NAMES[m[1]] || m[1];
  return chunked && m[1] !== "EVICT" && m[1] !== "LOAD" && m[1] !== "STEP" ? `${name}, chunk ${m[2] || 1}` : name;
}

// Busy time of a device inside [from, to] from its compute actions (transfers overlap).
function busyIn(actions, from, to) {
  let busy = 0;
  for (const a of actions) {
    if (a[0] === "EVICT" || a[0] === "LOAD") continue;
    const s = Math.max(from, a[3]), e = Math.min(to, a[4]);
    if (e > s) busy += e - s;
  }
  return busy;
}

function gantt(timeline) {
  const devices = timeline.devices;
  const makespan = timeline.makespan;
  const chunked = devices.some((d) => (d.stages || []).length > 1);
  const present = [];
  for (const d of devices) for (const a of d.actions) {
    const key = kindKey(a[0], chunkOf(d, a[1]));
    if (!present.includes(key)) present.push(key);
  }
  const order = Object.keys(KIND_NAMES);
  present.sort((a, b) => order.indexOf(a.replace(/\d+$/, "")) - order.indexOf(b.replace(/\d+$/, "")) || a.localeCompare(b));

  const overview = el("canvas", { id: "gantt-overview", class: "overview" });
  const canvas = el("canvas", { id: "gantt" });
  const tip = el("div", { class: "muted", id: "gantt-tip" }, "Scroll or use the buttons to zoom, drag to pan, click the overview to jump; hover an action for its details.");
  let view = { from: 0, to: makespan };
  const rowH = devices.length > 24 ? 10 : devices.length > 12 ? 14 : 20;

  function frame(c, height) {
    const ratio = window.devicePixelRatio || 1;
    const width = c.clientWidth || 1000;
    c.width = width * ratio; c.height = height * ratio; c.style.height = height + "px";
    const ctx = c.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px system-ui"; ctx.textBaseline = "middle";
    return [ctx, width];
  }

  function drawOverview() {
    const h = Math.max(4, Math.min(8, Math.floor(60 / devices.length)));
    const height = devices.length * h + 6;
    const [ctx, width] = frame(overview, height);
    const plotW = width - GANTT_LEFT - GANTT_RIGHT;
    const cols = Math.max(1, Math.floor(plotW));
    const busy = [];
    devices.forEach((dev, row) => {
      const y = 3 + row * h;
      ctx.fillStyle = IDLE_SHADE; ctx.fillRect(GANTT_LEFT, y, plotW, h - 1);
      // Busy fraction of each pixel column, accumulated from the actions it overlaps.
      const fill = new Float64Array(cols);
      const per = makespan / cols;
      for (const a of dev.actions) {
        if (a[0] === "EVICT" || a[0] === "LOAD") continue;
        let c0 = Math.floor(a[3] / per), c1 = Math.min(cols - 1, Math.floor(a[4] / per));
        for (let c = c0; c <= c1; c++) fill[c] += Math.max(0, Math.min(a[4], (c + 1) * per) - Math.max(a[3], c * per)) / per;
      }
      ctx.fillStyle = "#2f3b52";
      for (let c = 0; c < cols; c++) if (fill[c] > 0) { ctx.globalAlpha = Math.min(1, fill[c]); ctx.fillRect(GANTT_LEFT + c, y, 1, h - 1); }
      ctx.globalAlpha = 1;
      busy.push(busyIn(dev.actions, 0, makespan) / makespan);
    });
    ctx.fillStyle = "#555"; ctx.textAlign = "left";
    ctx.fillText("overview", 4, height / 2);
    const x0 = GANTT_LEFT + (view.from / makespan) * plotW, x1 = GANTT_LEFT + (view.to / makespan) * plotW;
    ctx.strokeStyle = "#d62728"; ctx.lineWidth = 1.5; ctx.strokeRect(x0 + 0.75, 1, Math.max(2, x1 - x0 - 1.5), height - 2);
    overview.dataset.busy = JSON.stringify(busy.map((b) => +b.toFixed(4)));
  }

  function draw() {
    const height = devices.length * rowH + 26;
    const [ctx, width] = frame(canvas, height);
    const plotW = width - GANTT_LEFT - GANTT_RIGHT;
    const span = view.to - view.from;
    const sx = (t) => GANTT_LEFT + ((t - view.from) / span) * plotW;
    let labels = 0;
    devices.forEach((dev, row) => {
      const y = row * rowH;
      ctx.fillStyle = "#333"; ctx.textAlign = "left"; ctx.fillText(`dev ${dev.device}`, 4, y + rowH / 2);
      ctx.fillStyle = IDLE_SHADE; ctx.fillRect(GANTT_LEFT, y + 1, plotW, rowH - 2);
      for (const a of dev.actions) {
        const [kind, stage, mb, s, e] = a;
        if (e < view.from || s > view.to) continue;
        const x0 = Math.max(GANTT_LEFT, sx(s)), x1 = Math.min(width - GANTT_RIGHT, sx(e));
        const transfer = kind === "EVICT" || kind === "LOAD";
        const chunk = chunkOf(dev, stage);
        ctx.fillStyle = kindColor(kindKey(kind, chunk));
        const h = transfer ? rowH * 0.35 : rowH - 2;
        ctx.fillRect(x0, y + (transfer ? rowH - h - 1 : 1), Math.max(1, x1 - x0 - 0.5), h);
        if (!transfer) {
          const text = String(mb);
          if (x1 - x0 >= ctx.measureText(text).width + 4 && rowH >= 12) {
            ctx.fillStyle = chunk > 0 ? "#1d2127" : "#fff"; ctx.textAlign = "left";
            ctx.fillText(text, x0 + 2, y + rowH / 2); labels++;
          }
        }
      }
    });
    // Time axis: round ticks inside the view; a label that would leave the frame is aligned
    // to the frame's edge instead.
    const { step, ticks } = niceTicks(view.from, view.to, Math.max(2, Math.floor(plotW / 90)));
    const unitMs = span < 1;
    const scale = unitMs ? 1000 : 1, unit = unitMs ? " ms" : " s";
    const decimals = stepDecimals(step * scale);
    const axisY = devices.length * rowH + 14;
    ctx.fillStyle = "#555"; ctx.strokeStyle = "#999";
    const extents = [];
    for (const t of ticks) {
      const x = sx(t);
      ctx.beginPath(); ctx.moveTo(x, devices.length * rowH); ctx.lineTo(x, devices.length * rowH + 4); ctx.stroke();
      const text = (t * scale).toFixed(decimals) + unit;
      const w = ctx.measureText(text).width;
      let left = x - w / 2;
      left = Math.min(Math.max(left, 0), width - w - 1);
      ctx.textAlign = "left"; ctx.fillText(text, left, axisY);
      extents.push([+(t * scale).toFixed(decimals), +left.toFixed(1), +(left + w).toFixed(1)]);
    }
    canvas.dataset.rowH = rowH;
    canvas.dataset.labels = labels;
    canvas.dataset.ticks = JSON.stringify(extents);
    canvas.dataset.view = JSON.stringify([view.from, view.to]);
    canvas.dataset.frame = JSON.stringify([GANTT_LEFT, width - GANTT_RIGHT, width]);
    drawOverview();
  }
  // What the chart shows, for people reading the page source and for the browser tests.
  canvas.dataset.actionsPerDevice = JSON.stringify(devices.map((d) => d.actions.length));
  canvas.dataset.kinds = JSON.stringify(present);
  canvas.dataset.colors = JSON.stringify(Object.fromEntries(present.map((k) => [k, kindColor(k)])));

  const setView = (from, to) => {
    const span = Math.min(makespan, Math.max(makespan / 5000, to - from));
    view.from = Math.min(Math.max(0, from), makespan - span); view.to = view.from + span; draw();
  };
  const zoom = (factor, at) => {
    const span = view.to - view.from, frac = (at - view.from) / span;
    const next = Math.min(makespan, Math.max(makespan / 5000, span * factor));
    setView(at - frac * next, at - frac * next + next);
  };
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const frac = Math.min(1, Math.max(0, (ev.clientX - rect.left - GANTT_LEFT) / (rect.width - GANTT_LEFT - GANTT_RIGHT)));
    zoom(ev.deltaY < 0 ? 0.8 : 1.25, view.from + frac * (view.to - view.from));
  }, { passive: false });
  let drag = null;
  canvas.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, from: view.from, to: view.to }; });
  window.addEventListener("mouseup", () => { drag = null; });
  canvas.addEventListener("mousemove", (ev) => {
    const rect = canvas.getBoundingClientRect();
    const span = view.to - view.from, plotW = rect.width - GANTT_LEFT - GANTT_RIGHT;
    if (drag) { const dt = -(ev.clientX - drag.x) / plotW * span; setView(drag.from + dt, drag.from + dt + span); return; }
    const row = Math.floor((ev.clientY - rect.top) / rowH);
    const t = view.from + ((ev.clientX - rect.left - GANTT_LEFT) / plotW) * span;
    const dev = devices[row];
    if (!dev) return;
    const hit = dev.actions.find((a) => a[3] <= t && t <= a[4]);
    tip.textContent = hit
      ? `device ${dev.device}: ${kindLabel(kindKey(hit[0], chunkOf(dev, hit[1])), chunked)} of stage ${hit[1]}, micro-batch ${hit[2]}, ${fmt(hit[3], 4)} – ${fmt(hit[4], 4)} s`
      : `device ${dev.device}: idle at ${fmt(t, 4)} s`;
  });
  overview.addEventListener("click", (ev) => {
    const rect = overview.getBoundingClientRect();
    const t = (ev.clientX - rect.left - GANTT_LEFT) / (rect.width - GANTT_LEFT - GANTT_RIGHT) * makespan;
    const span = view.to - view.from;
    setView(t - span / 2, t + span / 2);
  });
  const total = devices.map((d) => d.actions.length).reduce((a, b) => a + b, 0);
  const tools = el("div", { class: "gantt-tools" },
    el("button", { id: "gantt-zoom-in", onclick: () => zoom(0.5, (view.from + view.to) / 2) }, "zoom in"),
    el("button", { id: "gantt-zoom-out", onclick: () => zoom(2, (view.from + view.to) / 2) }, "zoom out"),
    el("button", { id: "gantt-whole", onclick: () => setView(0, makespan) }, "whole step"),
    el("span", { class: "muted" }, `makespan ${fmt(makespan, 3)} s, bubble ${pct(timeline.bubble_fraction)}; ${total} actions` + (timeline.truncated ? ` (the first ${total} of the step; the rest from ${fmt(timeline.next_start_s, 3)} s on)` : "")),
  );
  const legend = el("div", { class: "legend", id: "gantt-legend" },
    present.map((k) => el("span", { style: `--c:${kindColor(k)}`, "data-kind": k }, kindLabel(k, chunked))),
    el("span", { class: "idle", style: `--c:${IDLE_SHADE}` }, "idle"));
  const box = el("div", { class: "card" }, tools, overview, canvas, legend, tip);
  requestAnimationFrame(draw);
  window.addEventListener("resize", () => { if (canvas.isConnected) draw(); });
  return box;
}

// A schedule too large to simulate action by action: each device's time, as the server
// summarised it (the step is priced like the plan: warm-up and steady state simulated),
// with a busy/idle bar per device.
function timelineSummary(timeline) {
  const rows = timeline.devices.map((d) => {
    const share = timeline.makespan > 0 ? d.busy_s / timeline.makespan : 0;
    return el("tr", {},
      el("td", {}, String(d.device)), el("td", {}, d.stages.join(",")),
      el("td", {}, fmt(d.forward_s, 3)), el("td", {}, fmt(d.backward_s, 3)), el("td", {}, fmt(d.weight_s, 3)),
      el("td", {}, fmt(d.busy_s, 3)), el("td", {}, fmt(d.idle_s, 3)),
      el("td", { class: "l" }, el("div", { class: "busybar", title: `busy ${pct(share)}` }, el("div", { style: `width:${(100 * share).toFixed(1)}%` }))));
  });
  return el("div", { class: "card", id: "timeline-summary" },
    el("div", { class: "muted" }, `${timeline.num_actions} actions: too many to draw one by one; per device over the step (makespan ${fmt(timeline.makespan, 3)} s, bubble ${pct(timeline.bubble_fraction)}), busy in dark, idle shaded`),
    el("table", {}, el("tr", {}, ...["device", "stages", "forward s", "backward s", "weight s", "busy s", "idle s", "busy / idle"].map((h) => el("th", {}, h))), ...rows));
}
