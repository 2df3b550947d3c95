// A plan's page: the best configuration, every ranked candidate, the chart of all of them,
// and the rejected ones grouped by reason; clicking any candidate (ranked, or rejected for
// its memory) opens its details below, and the URL names it (#/plans/ID/candidates/RANK,
// #/plans/ID/rejected/N), so a link to it can be shared and a reload shows the same.
"use strict";

let shown = null; // { id, plan }: the plan on the page, kept while only the selection changes
const REJECTED_PAGE = 100;

// `lost`: how many refreshes of a waiting plan in a row found no service (0 on a first
// load). A waiting page keeps refreshing through a dropped network or a restarting service,
// less often the longer it lasts; a first load says what happened and stops.
async function showPlan(id, selection, lost = 0, waiting = false) {
  if (shown && shown.id === id && document.getElementById("detail")) return selectDetail(selection);
  const live = pageTicket();
  shown = null;
  if (!waiting) app.replaceChildren(el("p", { class: "muted" }, "Loading plan…"));
  const { status, body } = await api(`/v1/plans/${id}?include_rejected=true`);
  if (!live()) return;
  const again = (tries, delay) => setTimeout(() => { if (live() && location.hash.startsWith(`#/plans/${id}`)) showPlan(id, selection, tries, true); }, delay);
  if (waiting && (status === 0 || status >= 502)) {
    const delay = Math.min(2000 * (lost + 1), 15000);
    const why = status === 0 ? "no answer" : `the server answered ${status}`;
    document.getElementById("plan-wait").replaceChildren(el("div", { class: "banner bad" },
      `Lost contact with the service (${why}). The search goes on there; this page tries again in ${delay / 1000} s.`));
    return again(lost + 1, delay);
  }
  if (status === 404) return app.replaceChildren(el("div", { class: "banner bad" }, `No plan ${id} in this store: the link may be mistyped, or the plan was deleted. `, el("a", { href: "#/" }, "See the plans in the store.")));
  if (status !== 200) return app.replaceChildren(el("div", { class: "banner bad" }, problemText(body)));
  const state = body.status || "done";
  if (state !== "done") {
    app.replaceChildren(el("h1", {}, `Plan ${id.slice(0, 8)}`),
      el("div", { class: "card" }, `Status: ${state}. `, state === "failed" ? problemText(body.error || body) : "This page refreshes until the search finishes."),
      el("div", { id: "plan-wait" }));
    if (state !== "failed") again(0, 1000);
    return;
  }
  const hw = await api("/v1/hardware");
  if (!live()) return;
  const entry = hw.status === 200 ? (hw.body.items || hw.body).find((h) => h.name === body.request.cluster.gpu) : null;
  body.capacity_gib = entry ? entry.usable_memory_gib : null;
  shown = { id, plan: body };
  renderPlan(id, body);
  selectDetail(selection, false);
}

function renderPlan(id, plan) {
  const req = plan.request;
  const best = plan.best;
  const parts = [
    el("h1", {}, `${req.model.name} on ${req.cluster.num_nodes} × ${req.cluster.gpus_per_node} ${req.cluster.gpu}`),
    el("p", { class: "muted" }, `global batch ${req.training.global_batch_size}, sequence ${req.model.seq_length}, ${req.training.precision}; ` +
      `${plan.stats.evaluated.toLocaleString("en")} configurations, ${plan.stats.feasible.toLocaleString("en")} fit, searched in ${fmt(plan.stats.search_ms, 0)} ms (${req.search.method})`),
  ];
  // What of the requested space was not searched, and why (Plan.notes).
  if (plan.notes && plan.notes.length) parts.push(el("div", { id: "plan-notes" }, ...plan.notes.map((n) => el("div", { class: "muted" }, "• " + n))));
  // The server's warnings: settings of the request it changed (a CP-SAT time limit lowered
  // to its cap) and, for a plan without candidates, why nothing fits and what may help (the
  // CLI's text, added last). The hint at the API's query parameter is for API callers: this
  // page lists the rejected configurations below anyway.
  const warnings = (plan.warnings || []).slice();
  const noFit = best ? null : warnings.pop();
  if (warnings.length) parts.push(el("div", { class: "banner", id: "plan-warnings" }, ...warnings.map((w) => el("div", {}, "• " + w))));
  if (!best) {
    const why = (noFit || "No configuration fits.").replace(/\s*\?include_rejected=true[^.]*\.$/, "");
    parts.push(el("div", { class: "banner bad", id: "no-fit" }, why + (plan.rejected && plan.rejected.length ? " The rejected list below says why for each; click one for its memory." : "")));
  }
  if (best) {
    const p = best.predicted;
    parts.push(el("div", { class: "kpis", id: "best" },
      kpi("best configuration", cfgText(best.config)),
      kpi("samples / s", fmt(p.samples_per_s, 3)), kpi("tokens / s", fmt(p.tokens_per_s, 0)),
      kpi("step time", fmt(p.iteration_time_s, 3) + " s"), kpi("MFU", pct(p.mfu)),
      kpi("bubble", pct(p.bubble_fraction)), kpi("peak memory", fmt(p.peak_memory_gib, 1) + " GiB")));
  }
  parts.push(el("h2", {}, `Candidates (${plan.candidates.length}) `, el("span", { class: "muted small" }, "click a row for its schedule, memory and launch files")), candidatesTable(id, plan));
  parts.push(el("div", { class: "grid2" },
    el("div", {}, el("h2", {}, "Throughput against peak memory"), scatter(plan, plan.capacity_gib, (kind, n) => { location.hash = `#/plans/${id}/${kind}/${n}`; })),
    el("div", {}, plan.by_schedule && plan.by_schedule.length ? [el("h2", {}, "Does a schedule pay off here?"), scheduleTable(plan)] : "")));
  parts.push(el("section", { id: "detail", class: "detail" }));
  parts.push(el("h2", {}, `Rejected (${plan.rejected.length.toLocaleString("en")})`), rejectedSection(id, plan));
  app.replaceChildren(...parts);
}
function kpi(k, v) { return el("div", { class: "kpi" }, el("div", { class: "k" }, k), el("div", { class: "v" }, v)); }

// The details of the selected candidate ({kind: "candidates"|"rejected", n: 1-based}).
function selectDetail(selection, scroll = true) {
  const { id, plan } = shown;
  const box = document.getElementById("detail");
  for (const row of document.querySelectorAll("tr.selected")) row.classList.remove("selected");
  const list = selection.kind === "rejected" ? plan.rejected : plan.candidates;
  const item = list[selection.n - 1];
  if (!item) {
    box.replaceChildren(el("div", { class: "banner bad", id: "detail-missing" },
      `This plan has ${plural(list.length, selection.kind === "rejected" ? "rejected configuration" : "ranked candidate")}; there is no number ${selection.n}. `,
      el("a", { href: `#/plans/${id}` }, "Show the best.")));
    return;
  }
  const row = document.querySelector(`tr[data-${selection.kind}="${selection.n}"]`);
  if (row) row.classList.add("selected");
  if (selection.kind === "rejected") {
    const table = document.getElementById("rejected");
    if (table && !row && table.showRow) { table.showRow(selection.n); const again = document.querySelector(`tr[data-rejected="${selection.n}"]`); if (again) again.classList.add("selected"); }
    box.replaceChildren(...rejectedDetail(id, plan, item, selection.n));
  } else box.replaceChildren(...candidateDetail(id, plan, item, selection.n));
  box.dataset.selected = `${selection.kind}/${selection.n}`;
  if (scroll) box.scrollIntoView({ block: "start" });
}

function candidateDetail(id, plan, c, rank) {
  const p = c.predicted;
  const cap = plan.capacity_gib;
  const parts = [
    el("h2", { id: "detail-title" }, `Candidate #${rank}${rank === 1 ? " (best)" : ""}: ${cfgText(c.config)}`),
    el("p", { class: "muted" }, "Link to this candidate: ", el("a", { href: `#/plans/${id}/candidates/${rank}`, id: "detail-link" }, `${location.origin}/#/plans/${id}/candidates/${rank}`)),
    el("div", { class: "kpis" },
      kpi("samples / s", fmt(p.samples_per_s, 3)), kpi("step time", fmt(p.iteration_time_s, 3) + " s"), kpi("MFU", pct(p.mfu)),
      kpi("bubble", pct(p.bubble_fraction)), kpi("peak memory", fmt(p.peak_memory_gib, 1) + " GiB"),
      kpi("micro-batches", `${c.config.num_microbatches} × ${c.config.micro_batch_size}`), kpi("times from", p.time_source || "–")),
  ];
  if (c.semantics === "stale") parts.push(el("div", { class: "banner bad", id: "stale-weights" },
    `${c.config.schedule} updates weights with gradients of older weights (stale weights): it changes the training, not only its speed. The request allowed it (search.allow_stale_weights).`));
  if (c.refinement) parts.push(el("div", { class: "card" }, el("b", {}, `CP-SAT (${c.refinement.status}): `), c.refinement.changes.join("; ")));
  for (const note of c.notes || []) parts.push(el("div", { class: "muted" }, "• " + note));
  const heading = el("h3", { id: "gantt-heading" }, `Schedule timeline: ${c.config.schedule}, ${plural(c.config.p, "device")}`);
  const gantt = el("div", { id: "gantt-box" }, el("p", { class: "muted" }, "Simulating the schedule…"));
  const overTime = el("div", { id: "memory-time-box" }, el("p", { class: "muted" }, "Simulating the schedule…"));
  const rows = (c.breakdown || []).map((r) => ({ device: r.device, parameters: r.parameters_gib, gradients: r.gradients_gib, optimizer: r.optimizer_gib, activations: r.activations_gib, allowance: r.allowance_gib }));
  parts.push(heading, gantt,
    el("div", { class: "grid2" },
      el("div", {}, el("h3", {}, "Memory per device (at its peak)"), rows.length ? memoryBars(rows, cap) : el("p", { class: "muted" }, "–")),
      el("div", {}, el("h3", {}, "Memory over the step"), overTime)),
    el("h3", {}, "Per pipeline device"), breakdownTable(c),
    el("h3", {}, "Launch"), launchBlock(id, c, rank));
  loadTimeline(id, rank - 1, c, heading, gantt, overTime, cap);
  return parts;
}

async function loadTimeline(id, index, c, heading, box, overTime, cap) {
  const { status, body } = await api(`/v1/plans/${id}/timeline?candidate=${index}`);
  if (status !== 200) {
    box.replaceChildren(el("div", { class: "banner bad" }, problemText(body)));
    overTime.replaceChildren();
    return;
  }
  // The heading counts what the chart draws: 2BW runs two batches without a flush.
  const drawn = body.num_microbatches ?? c.config.num_microbatches;
  let text = `Schedule timeline: ${c.config.schedule}, ${plural(c.config.p, "device")}, ${plural(drawn, "micro-batch", "micro-batches")}`;
  if ((body.num_batches || 1) > 1) text += ` (${body.num_batches} batches of ${c.config.num_microbatches} without a flush between them; a step is one batch)`;
  heading.textContent = text;
  heading.dataset.microbatches = drawn;
  box.replaceChildren(body.mode === "summary" ? timelineSummary(body) : gantt(body));
  overTime.replaceChildren(memoryOverTime(body, cap));
}

function breakdownTable(c) {
  const rows = c.breakdown || [];
  const totals = c.predicted.memory_gib_per_device || [];
  const heads = ["device", "stages", "layers", "compute s", "comm s", "bubble s", "params", "grads", "optim", "activ.", "allow.", "in flight", "total GiB"];
  return el("div", { class: "scroll" }, el("table", { id: "breakdown" },
    el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r, i) => el("tr", {},
      [r.device, r.stages.join(","), r.layers, fmt(r.compute_s, 3), fmt(r.communication_s, 3), fmt(r.bubble_s, 3),
        fmt(r.parameters_gib, 2), fmt(r.gradients_gib, 2), fmt(r.optimizer_gib, 2), fmt(r.activations_gib, 2), fmt(r.allowance_gib, 2),
        fmt(r.in_flight_microbatches, 2), fmt(totals[i], 2)].map((v) => el("td", {}, String(v))))))));
}

function rejectedDetail(id, plan, r, n) {
  const parts = [
    el("h2", { id: "detail-title" }, `Rejected #${n}: ${cfgText(r.config)}`),
    el("p", { class: "muted" }, "Link to this configuration: ", el("a", { href: `#/plans/${id}/rejected/${n}`, id: "detail-link" }, `${location.origin}/#/plans/${id}/rejected/${n}`)),
    el("div", { class: "banner bad", id: "rejected-reason" }, r.reason),
  ];
  const memory = el("div", { id: "rejected-memory" }, r.predicted ? el("p", { class: "muted" }, "Counting its memory…") : el("p", { class: "muted" }, "Rejected before it was priced (a broken constraint), so it has no memory figure."));
  parts.push(el("h3", {}, "Memory per device"), memory,
    el("p", { class: "muted" }, "Rejected configurations are not simulated: no schedule timeline or launch files."));
  if (r.predicted) loadRejectedMemory(id, n, plan.capacity_gib, memory, r.predicted.peak_memory_gib);
  return parts;
}

async function loadRejectedMemory(id, n, cap, box, searched) {
  const { status, body } = await api(`/v1/plans/${id}/rejected/${n - 1}`);
  if (status !== 200) return box.replaceChildren(el("div", { class: "banner bad" }, problemText(body)));
  const rows = body.memory.map((m, device) => ({ device, ...m }));
  const peak = Math.max(...rows.map((m) => m.total));
  // The search stops counting once the weights alone are over; here the activations are in.
  const note = peak > searched + 0.05 ? el("p", { class: "muted", id: "rejected-note" },
    `The search stopped counting at ${fmt(searched, 1)} GiB (the weights, gradients and optimizer states were already over); with its activations this configuration needs ${fmt(peak, 1)} GiB on its fullest device.`) : "";
  const heads = ["device", "params", "grads", "optim", "activ.", "allow.", "in flight", "total GiB", "over by"];
  const table = el("div", { class: "scroll" }, el("table", { id: "rejected-breakdown" }, el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((m) => el("tr", {}, [m.device, fmt(m.parameters, 2), fmt(m.gradients, 2), fmt(m.optimizer, 2), fmt(m.activations, 2), fmt(m.allowance, 2), fmt(m.in_flight, 2), fmt(m.total, 2),
      cap && m.total > cap ? fmt(m.total - cap, 2) + " GiB" : "fits"].map((v) => el("td", {}, String(v))))))));
  box.replaceChildren(note, el("div", { class: "grid2" }, el("div", {}, memoryBars(rows, cap, "rejected-bars")), el("div", {}, table)));
}

// A table sorted by a clicked column, optionally paged (`pageSize`) and with clickable rows
// (`href(row)`); `rowData(row)` gives the row's data- attributes. From the keyboard: each
// heading is a button (its th says how the table is sorted, aria-sort), and a clickable row's
// first cell is a link to the same place (`linkLabel(row)` names it).
function sortableTable(id, columns, rows, initial, options = {}) {
  const table = el("table", { id });
  const thead = el("thead"), tbody = el("tbody");
  const pager = el("div", { class: "pager", id: `${id}-pager` });
  let key = initial ? initial.index : -1, dir = initial ? initial.dir : 1, page = 0, data = rows;
  const size = options.pageSize || Infinity;
  function sorted() {
    const out = data.slice();
    if (key >= 0) out.sort((a, b) => { const x = columns[key].value(a), y = columns[key].value(b); return (x < y ? -1 : x > y ? 1 : 0) * dir; });
    return out;
  }
  function draw() {
    const all = sorted();
    const pages = Math.max(1, Math.ceil(all.length / size));
    page = Math.min(page, pages - 1);
    const visible = size === Infinity ? all : all.slice(page * size, (page + 1) * size);
    tbody.replaceChildren(...visible.map((r) => {
      const attrs = { class: r.__best ? "best" : "", ...(options.rowData ? options.rowData(r) : {}) };
      if (options.href) { attrs.class += " pick"; attrs.onclick = (ev) => { if (!ev.target.closest("a")) location.hash = options.href(r); }; }
      return el("tr", attrs, columns.map((c, i) => {
        const content = c.text ? c.text(r) : c.value(r);
        return el("td", { class: c.left ? "l" : "" }, i === 0 && options.href ? el("a", { href: options.href(r), "aria-label": options.linkLabel ? options.linkLabel(r) : null }, content) : content);
      }));
    }));
    thead.replaceChildren(el("tr", {}, columns.map((c, i) => el("th", {
      class: `sortable ${c.left ? "l" : ""} ${i === key ? (dir > 0 ? "sorted-asc" : "sorted-desc") : ""}`,
      "aria-sort": i === key ? (dir > 0 ? "ascending" : "descending") : null,
      onclick: () => { if (key === i) dir = -dir; else { key = i; dir = 1; } draw(); },
    }, el("button", { type: "button", class: "sort" }, c.label)))));
    if (size !== Infinity) {
      const first = all.length ? page * size + 1 : 0, last = Math.min(all.length, (page + 1) * size);
      pager.replaceChildren(
        el("button", { id: `${id}-prev`, disabled: page === 0 ? "" : null, onclick: () => { page--; draw(); } }, "‹ previous"),
        el("span", { class: "muted", id: `${id}-range` }, ` rows ${first.toLocaleString("en")}–${last.toLocaleString("en")} of ${all.length.toLocaleString("en")}, page ${page + 1} of ${pages} `),
        el("button", { id: `${id}-next`, disabled: page >= pages - 1 ? "" : null, onclick: () => { page++; draw(); } }, "next ›"));
    }
    const current = document.querySelector(`#detail[data-selected]`);
    if (current) { const [kind, n] = current.dataset.selected.split("/"); const row = tbody.querySelector(`tr[data-${kind}="${n}"]`); if (row) row.classList.add("selected"); }
  }
  table.append(thead, tbody);
  // Show the page holding a row (a shared link to a rejected configuration on a later page).
  table.showRow = (n) => { const i = sorted().findIndex((r) => r.__n === n); if (i >= 0 && size !== Infinity) { page = Math.floor(i / size); draw(); } };
  table.filter = (keep) => { data = rows.filter(keep); page = 0; draw(); };
  draw();
  return el("div", {}, el("div", { class: "scroll" }, table), size !== Infinity ? pager : "");
}

function candidatesTable(id, plan) {
  const rows = plan.candidates.map((c, i) => ({ ...c, __rank: i + 1, __best: i === 0 }));
  const cols = [
    { label: "#", value: (r) => r.__rank },
    { label: "t", value: (r) => r.config.t },
    // A cp column only when a candidate uses context parallelism, as in the CLI's table.
    ...(rows.some((r) => (r.config.cp || 1) > 1) ? [{ label: "cp", value: (r) => r.config.cp }] : []),
    { label: "p", value: (r) => r.config.p }, { label: "d", value: (r) => r.config.d },
    { label: "mb", value: (r) => r.config.micro_batch_size }, { label: "m", value: (r) => r.config.num_microbatches },
    { label: "recompute", value: (r) => r.config.recompute, left: true },
    { label: "schedule", value: (r) => r.config.schedule, left: true },
    { label: "weights", value: (r) => r.semantics || "synchronous", text: (r) => r.semantics === "stale" ? "stale" : "sync", left: true },
    { label: "runs on", value: (r) => (r.runtimes || []).join(", "), left: true },
    { label: "step s", value: (r) => r.predicted.iteration_time_s, text: (r) => fmt(r.predicted.iteration_time_s, 3) },
    { label: "samples/s", value: (r) => r.predicted.samples_per_s, text: (r) => fmt(r.predicted.samples_per_s, 3) },
    { label: "MFU", value: (r) => r.predicted.mfu, text: (r) => pct(r.predicted.mfu) },
    { label: "bubble", value: (r) => r.predicted.bubble_fraction, text: (r) => pct(r.predicted.bubble_fraction) },
    { label: "peak GiB", value: (r) => r.predicted.peak_memory_gib, text: (r) => fmt(r.predicted.peak_memory_gib, 1) },
  ];
  return sortableTable("candidates", cols, rows, null, { href: (r) => `#/plans/${id}/candidates/${r.__rank}`, linkLabel: (r) => `candidate #${r.__rank}: ${cfgText(r.config)}`, rowData: (r) => ({ "data-candidates": r.__rank }) });
}

function scheduleTable(plan) {
  return sortableTable("by-schedule", [
    { label: "schedule", value: (r) => r.schedule, left: true },
    { label: "weights", value: (r) => r.semantics || "synchronous", text: (r) => r.semantics === "stale" ? "stale (1 step)" : "synchronous", left: true },
    { label: "fit", value: (r) => r.feasible },
    { label: "best configuration", value: (r) => r.best_config ? cfgText(r.best_config) : "", left: true },
    { label: "step s", value: (r) => r.best_iteration_time_s ?? Infinity, text: (r) => fmt(r.best_iteration_time_s, 3) },
    { label: "vs best 1F1B", value: (r) => r.speedup_vs_1f1b ?? 0, text: (r) => r.speedup_vs_1f1b ? fmt(r.speedup_vs_1f1b, 3) + "×" : "–" },
  ], plan.by_schedule, { index: 4, dir: 1 });
}

// What kind of rejection a reason is: its text before the first ':', ';' or '(', numbers
// written as n (the same grouping as `stagewright plan --all`).
function reasonKind(reason) {
  return reason.split(/[:;(]/)[0].replace(/\b\d+(?:\.\d+)?\b/g, "n").trim();
}

function rejectedSection(id, plan) {
  if (!plan.rejected.length) return el("p", { class: "muted" }, "None.");
  const rows = plan.rejected.map((r, i) => ({ ...r, __n: i + 1, __kind: reasonKind(r.reason) }));
  const groups = new Map();
  for (const r of rows) groups.set(r.__kind, (groups.get(r.__kind) || 0) + 1);
  const ordered = [...groups.entries()].sort((a, b) => b[1] - a[1]);
  const table = sortableTable("rejected", [
    { label: "#", value: (r) => r.__n },
    { label: "configuration", value: (r) => cfgText(r.config), left: true },
    { label: "peak GiB", value: (r) => r.predicted ? r.predicted.peak_memory_gib : -1, text: (r) => r.predicted ? fmt(r.predicted.peak_memory_gib, 1) : "–" },
    { label: "reason", value: (r) => r.reason, left: true, text: (r) => el("span", { class: "reason" }, r.reason) },
  ], rows, { index: 0, dir: 1 }, { pageSize: REJECTED_PAGE, href: (r) => `#/plans/${id}/rejected/${r.__n}`, linkLabel: (r) => `rejected #${r.__n}: ${cfgText(r.config)}`, rowData: (r) => ({ "data-rejected": r.__n }) });
  const tableEl = table.querySelector("table");
  let active = null;
  const summary = el("table", { id: "rejected-reasons" },
    el("thead", {}, el("tr", {}, el("th", { class: "l" }, "reason"), el("th", {}, "configurations"), el("th", {}, ""))),
    el("tbody", {}, ordered.map(([kind, count]) => el("tr", { "data-kind": kind },
      el("td", { class: "l" }, kind), el("td", {}, count.toLocaleString("en")),
      el("td", {}, el("button", { class: "filter", "aria-label": `show only: ${kind}`, "aria-pressed": "false", onclick: (ev) => {
        active = active === kind ? null : kind;
        tableEl.filter(active ? (r) => r.__kind === active : () => true);
        for (const b of summary.querySelectorAll("button.filter")) { b.textContent = "show only"; b.setAttribute("aria-pressed", "false"); }
        if (active) { ev.target.textContent = "show all"; ev.target.setAttribute("aria-pressed", "true"); }
      } }, "show only"))))));
  return el("div", {}, el("div", { class: "card" }, summary), table);
}

// ------------------------------------------------------------------ launch artefacts
function launchBlock(id, c, rank) {
  const limits = Object.entries(c.runtime_limits || {}).map(([runtime, why]) => `${runtime}: ${why}`);
  const items = [
    ["torchrun (one command per node)", (c.launch.torchrun || []).join("\n")],
    ["Megatron-LM arguments", c.launch.megatron_args || "(Megatron-LM has no such schedule or split)"],
    ["torch.distributed.pipelining CSV", c.launch.torch_pipelining_csv || "(not expressible in that runtime)"],
    ["executor config (stagewright run CONFIG.json)", JSON.stringify(c.launch.executor_config, null, 1)],
  ];
  const download = el("p", {},
    tokenLink(el("a", { id: "launch-archive", href: `/v1/plans/${id}/launch.tar.gz`, download: `stagewright-plan-${id}.tar.gz` },
      "Download every candidate's launch files (.tar.gz)"), `stagewright-plan-${id}.tar.gz`),
    ` — this one is in candidate-${rank}/: the executor config, a torchrun script per node, Megatron-LM arguments and the torch CSV, as stagewright plan --emit writes them. `,
    tokenLink(el("a", { id: "launch-json", href: `/v1/plans/${id}/candidates/${rank - 1}/launch` }, "This candidate's complete launch JSON."), `stagewright-plan-${id}-candidate-${rank}-launch.json`),
    el("br"), `Runs as planned on: ${(c.runtimes || []).join(", ") || "none"}` + (limits.length ? ` (not on ${limits.join("; ")})` : ""));
  return el("div", { id: "launch" }, download, items.map(([title, text], i) => el("div", { class: "artefact card" },
    el("b", {}, title),
    el("button", { class: "copy", "data-copy": i, "aria-label": `copy the ${title}`, onclick: (ev) => copy(text, ev.target) }, "copy"),
    el("pre", {}, text.length > 20000 ? text.slice(0, 20000) + "\n… (copy gets all of it)" : text))));
}
async function copy(text, button) {
  try { await navigator.clipboard.writeText(text); button.textContent = "copied"; }
  catch { const area = el("textarea"); area.value = text; document.body.append(area); area.select(); document.execCommand("copy"); area.remove(); button.textContent = "copied"; }
  setTimeout(() => { button.textContent = "copy"; }, 1500);
}
