// Draws the report from the JSON blob in #rlotel-data. Offline: plotly.js is inlined above.
// Every chart is drawn, the ones in the window first: the page is ready (usable) once those
// are drawn and every control is wired; the others (and the long verdict table) are drawn
// when they come into view or, one per idle moment, right after (a chart's first draw costs
// tens of ms: all of them up front kept a long report blank for over a second).
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("rlotel-data").textContent);
  const config = { displaylogo: false, responsive: true };
  const drawers = new Map(); // chart (or big table) id → draws it, a promise; gone once started
  const drawing = []; // everything drawn or being drawn
  const onDrawn = new Map(); // chart id → wires it once drawn (the click-through to a step)
  const el = (id) => document.getElementById(id);
  const fmt = (v, digits = 4) =>
    v === null || v === undefined ? "" : typeof v === "number" ? +v.toPrecision(digits) : String(v);
  const escape = (s) =>
    String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const margin = { l: 60, r: 20, t: 30, b: 40 };
  // Every axis says its type: plotly otherwise guesses it by scanning each trace's values
  // (dates? categories?), which cost more than drawing a 10,000-step report's charts.
  // Steps are integers: one tick per step on a short run, plotly's integer ticks otherwise.
  const first = data.x.length ? data.x[0] : 0;
  const span = data.x.length ? data.x[data.x.length - 1] - first : 0;
  const stepAxis = span <= 12
    ? { type: "linear", title: { text: "step" }, tickmode: "linear", tick0: first, dtick: 1, tickformat: "d", hoverformat: "d" }
    : { type: "linear", title: { text: "step" }, tickformat: "d", hoverformat: "d" };
  // A ratio never goes below 0; shares and MFU never above 1.
  const seconds = (text) => ({ type: "linear", title: { text }, rangemode: "tozero" });
  const share = (text, top = 1) => ({ type: "linear", title: { text }, range: [0, top], tickformat: ".0%" });
  const known = (values) => values.filter((v) => v !== null && v !== undefined);
  const peak = (series) => Math.max(0, ...series.flatMap(known));

  function plot(id, traces, layout) {
    if (layout.legend && layout.legend.orientation === "h") { // above the plot, clear of the step axis title
      layout = { ...layout, legend: { ...layout.legend, x: 0, y: 1.02, yanchor: "bottom" } };
    }
    later(id, () => Plotly.newPlot(el(id), traces, { margin, ...layout }, config), layout.height);
  }

  // A chart to draw when it is in view: its box keeps the height it will have meanwhile.
  function later(id, draw, height) {
    if (height) el(id).style.minHeight = `${height}px`;
    drawers.set(id, draw);
  }

  function drawNow(id) {
    const draw = drawers.get(id);
    if (!draw) return Promise.resolve();
    drawers.delete(id);
    let done = draw();
    if (onDrawn.has(id)) done = done.then(() => onDrawn.get(id)(el(id)));
    drawing.push(done);
    return done;
  }

  function table(id, headers, rows) {
    const head = "<tr>" + headers.map((h) => `<th>${escape(h)}</th>`).join("") + "</tr>";
    const body = rows
      .map((r) => "<tr>" + r.map((c) => (typeof c === "number" ? `<td class="num">${fmt(c)}</td>` : String(c ?? "").startsWith("<td") ? c : `<td>${c ?? ""}</td>`)).join("") + "</tr>")
      .join("");
    el(id).innerHTML = head + body;
  }

  // --- header ---------------------------------------------------------------------------
  const per = data.steps_per_point > 1 ? `, downsampled to ${data.x.length} points of up to ${data.steps_per_point} steps` : "";
  el("meta").textContent = `${data.step_count} steps from ${data.source}${per}; ${data.processes.length} process(es), roles ${data.roles.join(", ")}`;
  if (data.skipped_lines > 0) {
    el("skipped").innerHTML = `<p class="warn" id="skipped-lines">${data.skipped_lines} line(s) of the input could not be read (truncated or corrupt) and were skipped; everything else is shown.</p>`;
  }

  // --- phases, share, unaccounted --------------------------------------------------------
  const phaseTraces = data.phases.map((name) => ({
    name, x: data.x, y: data.seconds[name], type: "scatter", mode: "lines", stackgroup: "step",
    hovertemplate: `${name} %{y:.4f}s<extra>step %{x}</extra>`,
  }));
  phaseTraces.push({
    name: "unaccounted", x: data.x, y: data.unaccounted, type: "scatter", mode: "lines",
    stackgroup: "step", line: { color: "#9aa0aa", dash: "dot" },
    hovertemplate: "unaccounted %{y:.4f}s<extra>step %{x}</extra>",
  });
  plot("chart-phases", phaseTraces, { xaxis: stepAxis, yaxis: seconds("seconds"), hovermode: "x unified" });
  const shareNames = Object.keys(data.share);
  plot("chart-share", [{
    type: "bar", orientation: "h", y: shareNames, x: shareNames.map((n) => data.share[n] * 100),
    text: shareNames.map((n) => (data.share[n] * 100).toFixed(1) + "%"), textposition: "auto",
    hovertemplate: "%{y}: %{x:.1f}% of step time<extra></extra>",
  }], { xaxis: { type: "linear", title: { text: "% of step time (run)" }, range: [0, 100] }, yaxis: { type: "category", autorange: "reversed", automargin: true } });

  // --- throughput and MFU ----------------------------------------------------------------
  const perf = [];
  if (data.throughput) perf.push({ name: "throughput (tokens/s/GPU)", x: data.x, y: data.throughput, type: "scatter", mode: "lines" });
  for (const [role, values] of Object.entries(data.mfu)) {
    perf.push({ name: `MFU ${role}`, x: data.x, y: values, type: "scatter", mode: "lines", yaxis: "y2" });
  }
  if (data.mfu_unknown.length) {
    el("mfu-note").hidden = false;
    el("mfu-note").textContent = `MFU ${data.mfu_unknown.join(", ")}: unknown — verl logged 0.0 every step (it knows no peak FLOPs for this device, e.g. a CPU), so no MFU line is drawn.`;
  }
  if (perf.length) {
    const mfuTop = Math.min(1, Math.max(0.05, 1.25 * peak(Object.values(data.mfu))));
    plot("chart-throughput", perf, {
      xaxis: stepAxis, yaxis: seconds("tokens/s/GPU"),
      yaxis2: { ...share("MFU", mfuTop), overlaying: "y", side: "right", tickformat: ".1%", visible: Object.keys(data.mfu).length > 0 },
      legend: { orientation: "h" }, margin: { ...margin, r: 70 },
    });
  } else {
    el("chart-throughput").innerHTML = '<p class="note">No token counts or MFU in this run.</p>';
  }

  // --- generation tail -------------------------------------------------------------------
  const tail = data.tail;
  const tailMode = data.x.length > 300 ? "lines" : "lines+markers"; // thousands of markers cost seconds
  const basis = { trajectory: "every trajectory span", sample: "every sample span" };
  const whole = tail.basis.map((b) => basis[b]).join(" / ");
  const tailTraces = [];
  if (tail.basis.length) {
    for (const q of ["p50", "p90", "p99"]) tailTraces.push({ name: `${q} (${whole})`, x: data.x, y: tail[q], type: "scatter", mode: tailMode, connectgaps: false });
  }
  if (known(tail.slowest_span).length) {
    const long = data.x.length > 300; // a marker per point costs more than the other lines together
    tailTraces.push({ name: "slowest sample span (click: its step's tree)", x: data.x, y: tail.slowest_span, type: "scatter", mode: long ? "lines" : "markers", line: { color: "#555", width: 1, dash: "dot" }, marker: { symbol: "x", size: 9, color: "#555" } });
  }
  if (tail.verl_mean) tailTraces.push({ name: "mean generate_sequences (verl, all samples)", x: data.x, y: tail.verl_mean, type: "scatter", mode: "lines", line: { dash: "dash" } });
  if (tail.verl_max) tailTraces.push({ name: "max generate_sequences (verl, all samples)", x: data.x, y: tail.verl_max, type: "scatter", mode: "lines", line: { dash: "dot" } });
  const perStep = known(tail.samples_per_step);
  const meanSamples = perStep.length ? perStep.reduce((a, b) => a + b, 0) / perStep.length : 0;
  const notes = [];
  if (tail.basis.includes("trajectory")) notes.push(`p50/p90/p99 of the wall seconds of every trajectory of a step (one trajectory span per sample, about ${fmt(meanSamples, 3)} a step)`);
  if (tail.basis.includes("sample")) notes.push("p50/p90/p99 of per-sample seconds (generate + tools + score) where a step's sample spans cover all its sequences");
  if (tail.steps_without_every_sample) notes.push(`${tail.steps_without_every_sample} step(s) exported only their slowest samples' spans: no quantiles drawn for them (a quantile of the slowest few is not the step's tail)`);
  notes.push("× marks each step's slowest sample span, the drill-down (table below)");
  if (tail.verl_mean || tail.verl_max) notes.push("dashed: verl's agent_loop mean and max over every sample");
  el("tail-note").textContent = notes.join("; ") + ".";
  if (tailTraces.length) {
    plot("chart-tail", tailTraces, { xaxis: stepAxis, yaxis: seconds("seconds per sample"), legend: { orientation: "h" } });
  } else {
    el("chart-tail").innerHTML = '<p class="note">No per-sample timings in this run.</p>';
  }
  const unknown = (v) => (v === null || v === undefined ? '<td class="unknown">unknown</td>' : v);
  table("slowest-samples",
    ["step", "total s", "generate s", "tool calls s", "score s", "preempted", "prompt tokens", "response tokens", "process", "span id"],
    data.slowest_samples.map((s) => [s.step, s.total_s, s.generate_sequences_s, s.tool_calls_s, s.compute_score_s, unknown(s.num_preempted), s.prompt_length, s.response_length, escape(s.process), `<code>${escape(s.span_id)}</code>`]));

  // --- by data source (only when the step spans carry the figures) --------------------
  if (data.data_sources.length) {
    el("data-sources").hidden = false;
    const num = (x, text) => (x === null || x === undefined ? unknown(x) : `<td class="num">${text}</td>`);
    const signed = (x) => (x >= 0 ? "+" : "") + fmt(x);
    table("source-table",
      ["data source", "steps", "samples", "share of samples", "mean reward", "mean response tokens", "generate p90 s (median over steps)", "last step", "its mean reward", "last − run"],
      data.data_sources.map((r) => {
        const both = r.last_reward_mean !== null && r.reward_mean !== null;
        return [escape(r.name), r.steps, r.samples, num(r.share, `${(r.share * 100).toFixed(1)}%`),
          num(r.reward_mean, fmt(r.reward_mean)), num(r.response_mean, fmt(r.response_mean)),
          num(r.generate_p90_s, fmt(r.generate_p90_s)), r.last_step, num(r.last_reward_mean, fmt(r.last_reward_mean)),
          num(both ? r.last_reward_mean - r.reward_mean : null, both ? signed(r.last_reward_mean - r.reward_mean) : "")];
      }));
  }

  // --- verdicts --------------------------------------------------------------------------
  const v = data.verdicts;
  const colors = { high: "#c0392b", medium: "#e67e22", low: "#95a5a6" };
  const hover = "step %{x}: %{y}<br>%{customdata[0]} confidence, %{customdata[1]}% of the step<br>read next: %{customdata[2]}<extra></extra>";
  const verdictInfo = ([label, confidence, share]) => [confidence, (share * 100).toFixed(1), v.next_reads[v.labels[label]]];
  let verdictTraces;
  if (data.x.length <= 300) {
    verdictTraces = [{
      type: "scatter", mode: "markers", x: data.x, y: v.points.map(([label]) => v.labels[label]),
      marker: { size: 9, symbol: "square", color: v.points.map(([, confidence]) => colors[confidence]) },
      customdata: v.points.map(verdictInfo), hovertemplate: hover, showlegend: false,
    }];
  } else { // one path per confidence, a segment per run of equal points: thousands of markers cost seconds
    const byConfidence = {};
    const width = data.x.length > 1 ? data.x[1] - data.x[0] : 1;
    let start = 0;
    for (let i = 1; i <= v.points.length; i++) {
      const [label, confidence] = v.points[start];
      if (i < v.points.length && v.points[i][0] === label && v.points[i][1] === confidence) continue;
      const t = (byConfidence[confidence] ??= { type: "scatter", mode: "lines", name: `${confidence} confidence`, x: [], y: [], customdata: [], line: { width: 10, color: colors[confidence] }, hovertemplate: hover });
      const end = i < v.points.length ? data.x[i] : data.x[i - 1] + width;
      t.x.push(data.x[start], end, null);
      t.y.push(v.labels[label], v.labels[label], null);
      const info = verdictInfo(v.points[start]);
      t.customdata.push(info, info, null);
      start = i;
    }
    verdictTraces = Object.values(byConfidence);
  }
  plot("chart-verdicts", verdictTraces, { xaxis: stepAxis, yaxis: { type: "category", categoryarray: v.labels, automargin: true }, height: 110 + 28 * v.labels.length, showlegend: false });
  const evidence = (e) => Object.entries(e).map(([k, x]) => `${escape(k)}=${escape(fmt(x))}`).join(", ");
  // Up to 200 rows: the page's costliest layout (~0.1 s), so it is filled like a chart, when
  // in view; its scroll box keeps its height meanwhile.
  const runsBox = el("verdict-runs").parentElement;
  if (v.runs.length > 12) runsBox.style.minHeight = "360px";
  later("verdict-runs", () => {
    table("verdict-runs", ["steps", "verdict", "confidence", "share", "evidence (first step)", "read next", "trends"],
      v.runs.map((r) => [r.first === r.last ? `${r.first}` : `${r.first}–${r.last} (${r.steps})`, escape(r.label),
        `<span class="badge ${r.confidence}">${r.confidence}</span>`, `${(r.share * 100).toFixed(1)}%`, evidence(r.evidence), escape(r.next_read),
        Object.entries(r.trends).map(([w, t]) => `${escape(w)} ×${fmt(t.ratio)}${t.attribution ? " — " + escape(t.attribution) : ""}`).join("<br>")]));
    runsBox.style.minHeight = "";
    return Promise.resolve();
  });
  if (v.runs_total > v.runs.length) {
    el("verdict-runs").insertAdjacentHTML("afterend", `<p class="note">${v.runs_total - v.runs.length} more runs of steps; the chart shows every point.</p>`);
  }

  // --- goodput, idle, staleness (only when the run has them) ----------------------------
  const lines = (series) => Object.entries(series).map(([name, y]) => ({ name, x: data.x, y, type: "scatter", mode: "lines" }));
  const pick = (series, keep) => Object.fromEntries(Object.entries(series).filter(([name]) => keep(name)));
  const isSeconds = (name) => name.includes("seconds");
  const ratios = pick(data.efficiency, (n) => !isSeconds(n));
  const bucketSeconds = pick(data.efficiency, isSeconds);
  if (Object.keys(data.efficiency).length || Object.keys(data.staleness).length) {
    el("efficiency").hidden = false;
    if (Object.keys(ratios).length) plot("chart-efficiency", lines(ratios), { xaxis: stepAxis, yaxis: share("share of the step"), legend: { orientation: "h" } });
    if (Object.keys(bucketSeconds).length) plot("chart-bucket-seconds", lines(bucketSeconds), { xaxis: stepAxis, yaxis: seconds("seconds"), legend: { orientation: "h" } });
    if (Object.keys(data.staleness).length) plot("chart-staleness", lines(data.staleness), { xaxis: stepAxis, yaxis: seconds("steps behind"), legend: { orientation: "h" } });
  }

  // --- async bias, discards, occupancy (only when the run has them) ---------------------
  if (data.async_summary.length) {
    el("async-bias").hidden = false;
    table("async-summary", ["measure", "mean", "min", "max", "steps"],
      data.async_summary.map((r) => [escape(r.label), r.mean, r.min, r.max, r.steps]));
    if (Object.keys(data.bias).length) plot("chart-bias", lines(data.bias), { xaxis: stepAxis, yaxis: share("KS / share"), legend: { orientation: "h" } });
    const occupancy = pick(data.occupancy, (n) => !isSeconds(n));
    const occupancyTail = pick(data.occupancy, isSeconds);
    if (Object.keys(occupancy).length) plot("chart-occupancy", lines(occupancy), { xaxis: stepAxis, yaxis: share("occupancy (mean ÷ peak)"), legend: { orientation: "h" } });
    if (Object.keys(occupancyTail).length) plot("chart-occupancy-tail", lines(occupancyTail), { xaxis: stepAxis, yaxis: seconds("seconds"), legend: { orientation: "h" } });
  }

  // --- per-replica occupancy from trajectory spans (only when the run has them) --------
  const replicas = data.replica_occupancy;
  if (replicas.ratio) {
    el("replicas").hidden = false;
    plot("chart-replica-occupancy", lines(replicas.ratio), { xaxis: stepAxis, yaxis: share("occupancy (mean ÷ peak)"), legend: { orientation: "h" }, showlegend: true });
    plot("chart-replica-tail", lines(replicas.tail_seconds), { xaxis: stepAxis, yaxis: seconds("tail seconds"), legend: { orientation: "h" }, showlegend: true });
  }

  // --- weight sync, validation and checkpoints, stalls (only when the run has them) ----
  if (Object.keys(data.weight_sync).length) {
    el("weight-sync").hidden = false;
    plot("chart-weight-sync", lines(data.weight_sync), { xaxis: stepAxis, yaxis: seconds("seconds"), legend: { orientation: "h" } });
  }
  if (Object.keys(data.data_movement).length) {
    el("data-movement").hidden = false;
    plot("chart-data-movement", lines(data.data_movement), { xaxis: stepAxis, yaxis: seconds("seconds"), legend: { orientation: "h" } });
  }
  if (data.occasional.length) {
    el("occasional").hidden = false;
    table("occasional-table", ["window", "step", "seconds"], data.occasional.map((r) => [escape(r.name), r.step ?? "", r.seconds]));
  }
  if (data.stalls.length) {
    el("stalls").hidden = false;
    table("stall-table", ["phase", "step", "state", "open for s", "process"],
      data.stalls.map((r) => [escape(r.name), r.step ?? "", r.stalled ? "stalled" : "unfinished", r.open_s ?? r.seconds, escape(r.process)]));
  }

  // --- captures ------------------------------------------------------------------------
  const captureLink = (c) => (c.href ? `<a href="${escape(c.href)}">${escape(c.path.split("/").pop())}</a>` : `${escape(c.path)} (not found)`);
  if (data.captures.length) {
    table("capture-table", ["file", "tool", "role", "rank", "steps", "covers steps", "windows", "size", "top ops"],
      data.captures.map((c) => [captureLink(c), escape(c.tool), escape(c.role), c.rank, c.steps[0] === c.steps[1] ? `${c.steps[0]}` : `${c.steps[0]}–${c.steps[1]}`,
        c.covers.join(", "), (c.windows || []).map(escape).join(", "), c.size_bytes ? `${(c.size_bytes / 1024).toFixed(0)} KiB` : "", (c.top_ops || []).map(escape).join("<br>")]));
  } else {
    el("capture-table").innerHTML = "<tr><td>No profile.capture spans in this run (rlotel demo --profile-steps 2,3 makes some).</td></tr>";
  }

  // --- waterfall of one step -------------------------------------------------------------
  const select = el("step-select");
  select.innerHTML = data.tree_steps.map((n) => `<option value="${n}"${n === data.default_step ? " selected" : ""}>${n}</option>`).join("");
  const palette = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00"];

  function stepDetails(number, tree) {
    select.value = String(number);
    const d = tree.verdict;
    const caps = tree.captures.map((i) => captureLink(data.captures[i])).join(", ") || "none";
    el("step-details").innerHTML = `<dl><dt>verdict</dt><dd id="step-verdict">${escape(d.label)} <span class="badge ${d.confidence}">${d.confidence}</span> (${(d.share * 100).toFixed(1)}% of the step)</dd>
      <dt>evidence</dt><dd>${evidence(d.evidence)}</dd><dt>read next</dt><dd>${escape(d.next_read)}</dd>
      <dt>timing_raw</dt><dd>${evidence(tree.timing_raw)}</dd><dt>profile captures</dt><dd>${caps}</dd></dl>`;
  }

  // a waterfall row's fields by name (rows travel as arrays: `span_columns` names them)
  const col = Object.fromEntries(data.span_columns.map((name, i) => [name, i]));

  function waterfall(tree) {
    const rows = tree.rows;
    if (!rows.length) {
      el("chart-waterfall").innerHTML = '<p class="note">This input has no spans for the step (verl log): no tree to draw.</p>';
      return Promise.resolve();
    }
    const byRole = new Map();
    rows.forEach((r, i) => {
      if (!byRole.has(r[col.role])) byRole.set(r[col.role], []);
      byRole.get(r[col.role]).push([i, r]);
    });
    const traces = [...byRole.entries()].map(([role, list]) => ({
      type: "bar", orientation: "h", name: data.roles[role], marker: { color: palette[role % palette.length], line: { color: list.map(([, r]) => (r[col.error] ? "#c0392b" : "rgba(0,0,0,0)")), width: 2 } },
      y: list.map(([i]) => i), base: list.map(([, r]) => r[col.start_ms]), x: list.map(([, r]) => Math.max(r[col.duration_ms], 0.001)),
      customdata: list.map(([, r]) => [r[col.name], r[col.duration_ms].toFixed(3), r[col.span_id], escape(data.processes[r[col.process]]), Object.entries(r[col.attributes]).slice(0, 12).map(([k, x]) => `${k}=${fmt(x)}`).join("<br>")]),
      hovertemplate: "<b>%{customdata[0]}</b> %{customdata[1]} ms<br>span %{customdata[2]} in %{customdata[3]}<br>%{customdata[4]}<extra>%{fullData.name}</extra>",
    }));
    const layout = {
      barmode: "overlay", height: waterfallHeight(tree), showlegend: byRole.size > 1, legend: { title: { text: "role" } },
      xaxis: { type: "linear", title: { text: "ms since step start" }, rangemode: "tozero" },
      yaxis: { type: "linear", tickvals: rows.map((_, i) => i), ticktext: rows.map((r) => "\u00a0".repeat(2 * r[col.depth]) + r[col.name]), autorange: "reversed", automargin: true },
      margin: { ...margin, l: 140 },
    };
    return Plotly.react(el("chart-waterfall"), traces, layout, config);
  }
  const waterfallHeight = (tree) => Math.max(260, 60 + 20 * tree.rows.length);

  // A step picked (selector or click) is drawn at once, in place of any waiting first draw.
  function showStep(number) {
    const tree = data.trees[String(number)];
    if (!tree) return Promise.resolve();
    stepDetails(number, tree);
    drawers.delete("chart-waterfall");
    el("chart-waterfall").style.minHeight = ""; // the page's own minimum, as the plot grows
    return waterfall(tree);
  }
  select.addEventListener("change", () => showStep(Number(select.value)));
  const firstTree = data.trees[String(data.default_step)];
  if (firstTree) {
    stepDetails(data.default_step, firstTree);
    later("chart-waterfall", () => waterfall(firstTree), firstTree.rows.length ? waterfallHeight(firstTree) : 0);
  }
  const nearestTreeStep = (x) => data.tree_steps.reduce((best, n) => (Math.abs(n - x) < Math.abs(best - x) ? n : best), data.tree_steps[0]);
  for (const id of ["chart-phases", "chart-verdicts", "chart-tail"]) {
    onDrawn.set(id, (chart) => chart.on("plotly_click", (event) => showStep(nearestTreeStep(event.points[0].x))));
  }

  // --- drawing: the charts in the window now; the rest as they come into view, else idle --
  const inView = (id) => {
    const box = el(id).getBoundingClientRect();
    return box.width > 0 && box.top < window.innerHeight && box.bottom >= 0; // hidden: 0 wide
  };
  const visible = [...drawers.keys()].filter(inView);
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (entry.isIntersecting) drawNow(entry.target.id);
    }
  }, { rootMargin: "200px 0px" });
  for (const id of drawers.keys()) observer.observe(el(id));
  const idle = window.requestIdleCallback ?? ((next) => setTimeout(next, 1));
  function drawRest() {
    const [next] = drawers.keys();
    if (next === undefined) {
      observer.disconnect();
      Promise.all(drawing).then(() => {
        window.rlotelDrawnMs = performance.now();
        document.body.dataset.drawn = "1";
      });
      return;
    }
    drawNow(next).then(() => idle(drawRest, { timeout: 500 }));
  }
  Promise.all(visible.map(drawNow)).then(() => {
    window.rlotelReadyMs = performance.now();
    document.body.dataset.ready = "1";
    idle(drawRest, { timeout: 500 });
  });
})();
