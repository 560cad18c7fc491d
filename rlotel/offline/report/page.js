// Draws the report from the JSON blob in #rlotel-data. Offline: plotly.js is inlined above.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("rlotel-data").textContent);
  const config = { displaylogo: false, responsive: true };
  const pending = [];
  const el = (id) => document.getElementById(id);
  const fmt = (v, digits = 4) =>
    v === null || v === undefined ? "" : typeof v === "number" ? +v.toPrecision(digits) : String(v);
  const escape = (s) =>
    String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const stepAxis = { title: { text: "step" } };
  const margin = { l: 60, r: 20, t: 30, b: 40 };

  function plot(id, traces, layout) {
    pending.push(Plotly.newPlot(el(id), traces, { margin, ...layout }, config));
  }

  function table(id, headers, rows) {
    const head = "<tr>" + headers.map((h) => `<th>${escape(h)}</th>`).join("") + "</tr>";
    const body = rows
      .map((r) => "<tr>" + r.map((c) => (typeof c === "number" ? `<td class="num">${fmt(c)}</td>` : `<td>${c ?? ""}</td>`)).join("") + "</tr>")
      .join("");
    el(id).innerHTML = head + body;
  }

  // --- header ---------------------------------------------------------------------------
  const per = data.steps_per_point > 1 ? `, downsampled to ${data.x.length} points of up to ${data.steps_per_point} steps` : "";
  el("meta").textContent = `${data.step_count} steps from ${data.source}${per}; ${data.processes.length} process(es)`;
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
  plot("chart-phases", phaseTraces, { xaxis: stepAxis, yaxis: { title: { text: "seconds" } }, hovermode: "x unified" });
  const shareNames = Object.keys(data.share);
  plot("chart-share", [{
    type: "bar", orientation: "h", y: shareNames, x: shareNames.map((n) => data.share[n] * 100),
    text: shareNames.map((n) => (data.share[n] * 100).toFixed(1) + "%"), textposition: "auto",
    hovertemplate: "%{y}: %{x:.1f}% of step time<extra></extra>",
  }], { xaxis: { title: { text: "% of step time (run)" } }, yaxis: { autorange: "reversed", automargin: true } });

  // --- throughput and MFU ----------------------------------------------------------------
  const perf = [];
  if (data.throughput) perf.push({ name: "throughput (tokens/s/GPU)", x: data.x, y: data.throughput, type: "scatter", mode: "lines" });
  for (const [role, values] of Object.entries(data.mfu)) {
    perf.push({ name: `MFU ${role}`, x: data.x, y: values, type: "scatter", mode: "lines", yaxis: "y2" });
  }
  if (perf.length) {
    plot("chart-throughput", perf, {
      xaxis: stepAxis, yaxis: { title: { text: "tokens/s/GPU" } },
      yaxis2: { title: { text: "MFU" }, overlaying: "y", side: "right", tickformat: ".1%" },
      legend: { orientation: "h" }, margin: { ...margin, r: 70 },
    });
  } else {
    el("chart-throughput").innerHTML = '<p class="note">No token counts or MFU in this run.</p>';
  }

  // --- generation tail -------------------------------------------------------------------
  const tail = data.tail;
  const tailMode = data.x.length > 300 ? "lines" : "lines+markers"; // thousands of markers cost seconds
  const tailTraces = ["p50", "p90", "p99"].map((q) => ({ name: `${q} (sample spans)`, x: data.x, y: tail[q], type: "scatter", mode: tailMode, connectgaps: false }));
  if (tail.verl_mean) tailTraces.push({ name: "mean generate_sequences (all samples)", x: data.x, y: tail.verl_mean, type: "scatter", mode: "lines", line: { dash: "dash" } });
  if (tail.verl_max) tailTraces.push({ name: "max generate_sequences (all samples)", x: data.x, y: tail.verl_max, type: "scatter", mode: "lines", line: { dash: "dot" } });
  const perStep = tail.samples_per_step.filter((v) => v !== null);
  const meanSpans = perStep.length ? perStep.reduce((a, b) => a + b, 0) / perStep.length : 0;
  el("tail-note").textContent = meanSpans
    ? `Quantiles of per-sample seconds (generate + tools + score) over the sample spans of each step (about ${fmt(meanSpans, 3)} a step: rlotel exports the slowest max_sample_spans; raise it for the whole distribution). Dashed lines: verl's agent_loop mean and max over every sample, where the run logged them.`
    : "No sample spans in this run; dashed lines show verl's agent_loop mean and max where logged.";
  plot("chart-tail", tailTraces, { xaxis: stepAxis, yaxis: { title: { text: "seconds per sample" } }, legend: { orientation: "h" } });
  table("slowest-samples",
    ["step", "total s", "generate s", "tool calls s", "score s", "preempted", "prompt tokens", "response tokens", "process", "span id"],
    data.slowest_samples.map((s) => [s.step, s.total_s, s.generate_sequences_s, s.tool_calls_s, s.compute_score_s, s.num_preempted, s.prompt_length, s.response_length, escape(s.process), `<code>${escape(s.span_id)}</code>`]));

  // --- verdicts --------------------------------------------------------------------------
  const v = data.verdicts;
  plot("chart-verdicts", [{
    type: "scatter", mode: "markers", x: data.x, y: v.points.map(([label]) => v.labels[label]),
    marker: { size: data.x.length > 300 ? 5 : 9, symbol: "square", color: v.points.map(([, confidence]) => ({ high: "#c0392b", medium: "#e67e22", low: "#95a5a6" })[confidence]) },
    customdata: v.points.map(([label, confidence, share]) => [confidence, (share * 100).toFixed(1), v.next_reads[v.labels[label]]]),
    hovertemplate: "step %{x}: %{y}<br>%{customdata[0]} confidence, %{customdata[1]}% of the step<br>read next: %{customdata[2]}<extra></extra>",
  }], { xaxis: stepAxis, yaxis: { type: "category", categoryarray: v.labels, automargin: true }, height: 110 + 28 * v.labels.length });
  const evidence = (e) => Object.entries(e).map(([k, x]) => `${escape(k)}=${escape(fmt(x))}`).join(", ");
  table("verdict-runs", ["steps", "verdict", "confidence", "share", "evidence (first step)", "read next", "trends"],
    v.runs.map((r) => [r.first === r.last ? `${r.first}` : `${r.first}–${r.last} (${r.steps})`, escape(r.label),
      `<span class="badge ${r.confidence}">${r.confidence}</span>`, `${(r.share * 100).toFixed(1)}%`, evidence(r.evidence), escape(r.next_read),
      Object.entries(r.trends).map(([w, t]) => `${escape(w)} ×${fmt(t.ratio)}${t.attribution ? " — " + escape(t.attribution) : ""}`).join("<br>")]));
  if (v.runs_total > v.runs.length) {
    el("verdict-runs").insertAdjacentHTML("afterend", `<p class="note">${v.runs_total - v.runs.length} more runs of steps; the chart shows every point.</p>`);
  }

  // --- goodput, idle, staleness (only when the run has them) ----------------------------
  const lines = (series) => Object.entries(series).map(([name, y]) => ({ name, x: data.x, y, type: "scatter", mode: "lines" }));
  if (Object.keys(data.efficiency).length || Object.keys(data.staleness).length) {
    el("efficiency").hidden = false;
    if (Object.keys(data.efficiency).length) plot("chart-efficiency", lines(data.efficiency), { xaxis: stepAxis, yaxis: { title: { text: "ratio / seconds" } }, legend: { orientation: "h" } });
    if (Object.keys(data.staleness).length) plot("chart-staleness", lines(data.staleness), { xaxis: stepAxis, yaxis: { title: { text: "steps behind" } }, legend: { orientation: "h" } });
  }

  // --- async bias, discards, occupancy (only when the run has them) ---------------------
  if (data.async_summary.length) {
    el("async-bias").hidden = false;
    table("async-summary", ["measure", "mean", "min", "max", "steps"],
      data.async_summary.map((r) => [escape(r.label), r.mean, r.min, r.max, r.steps]));
    if (Object.keys(data.bias).length) plot("chart-bias", lines(data.bias), { xaxis: stepAxis, yaxis: { title: { text: "KS / share" }, range: [0, 1] }, legend: { orientation: "h" } });
    if (Object.keys(data.occupancy).length) plot("chart-occupancy", lines(data.occupancy), { xaxis: stepAxis, yaxis: { title: { text: "ratio / seconds" } }, legend: { orientation: "h" } });
  }

  // --- captures ------------------------------------------------------------------------
  const captureLink = (c) => (c.href ? `<a href="${escape(c.href)}">${escape(c.path.split("/").pop())}</a>` : `${escape(c.path)} (not found)`);
  if (data.captures.length) {
    table("capture-table", ["file", "tool", "role", "rank", "steps", "covers steps", "size", "top ops"],
      data.captures.map((c) => [captureLink(c), escape(c.tool), escape(c.role), c.rank, c.steps[0] === c.steps[1] ? `${c.steps[0]}` : `${c.steps[0]}–${c.steps[1]}`,
        c.covers.join(", "), c.size_bytes ? `${(c.size_bytes / 1024).toFixed(0)} KiB` : "", (c.top_ops || []).map(escape).join("<br>")]));
  } else {
    el("capture-table").innerHTML = "<tr><td>No profile.capture spans in this run (rlotel demo --profile-steps 2,3 makes some).</td></tr>";
  }

  // --- waterfall of one step -------------------------------------------------------------
  const select = el("step-select");
  select.innerHTML = data.tree_steps.map((n) => `<option value="${n}"${n === data.default_step ? " selected" : ""}>${n}</option>`).join("");
  const palette = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00"];

  function showStep(number) {
    const tree = data.trees[String(number)];
    if (!tree) return Promise.resolve();
    select.value = String(number);
    const rows = tree.rows;
    const byProcess = new Map();
    rows.forEach((r, i) => {
      if (!byProcess.has(r[4])) byProcess.set(r[4], []);
      byProcess.get(r[4]).push([i, r]);
    });
    const traces = [...byProcess.entries()].map(([p, list]) => ({
      type: "bar", orientation: "h", name: data.processes[p], marker: { color: palette[p % palette.length], line: { color: list.map(([, r]) => (r[6] ? "#c0392b" : "rgba(0,0,0,0)")), width: 2 } },
      y: list.map(([i]) => i), base: list.map(([, r]) => r[2]), x: list.map(([, r]) => Math.max(r[3], 0.001)),
      customdata: list.map(([, r]) => [r[0], r[3].toFixed(3), r[5], Object.entries(r[7]).slice(0, 12).map(([k, x]) => `${k}=${fmt(x)}`).join("<br>")]),
      hovertemplate: "<b>%{customdata[0]}</b> %{customdata[1]} ms<br>span %{customdata[2]}<br>%{customdata[3]}<extra>%{fullData.name}</extra>",
    }));
    const layout = {
      barmode: "overlay", height: Math.max(260, 60 + 20 * rows.length), showlegend: byProcess.size > 1,
      xaxis: { title: { text: "ms since step start" } },
      yaxis: { tickvals: rows.map((_, i) => i), ticktext: rows.map((r) => "\u00a0".repeat(2 * r[1]) + r[0]), autorange: "reversed", automargin: true },
      margin: { ...margin, l: 140 },
    };
    const d = tree.verdict;
    const caps = tree.captures.map((i) => captureLink(data.captures[i])).join(", ") || "none";
    el("step-details").innerHTML = `<dl><dt>verdict</dt><dd id="step-verdict">${escape(d.label)} <span class="badge ${d.confidence}">${d.confidence}</span> (${(d.share * 100).toFixed(1)}% of the step)</dd>
      <dt>evidence</dt><dd>${evidence(d.evidence)}</dd><dt>read next</dt><dd>${escape(d.next_read)}</dd>
      <dt>timing_raw</dt><dd>${evidence(tree.timing_raw)}</dd><dt>profile captures</dt><dd>${caps}</dd></dl>`;
    if (!rows.length) {
      el("chart-waterfall").innerHTML = '<p class="note">This input has no spans for the step (verl log): no tree to draw.</p>';
      return Promise.resolve();
    }
    return Plotly.react(el("chart-waterfall"), traces, layout, config);
  }
  select.addEventListener("change", () => showStep(Number(select.value)));
  pending.push(showStep(data.default_step));
  const nearestTreeStep = (x) => data.tree_steps.reduce((best, n) => (Math.abs(n - x) < Math.abs(best - x) ? n : best), data.tree_steps[0]);
  Promise.all(pending).then(() => {
    for (const id of ["chart-phases", "chart-verdicts", "chart-tail"]) {
      el(id).on("plotly_click", (event) => showStep(nearestTreeStep(event.points[0].x)));
    }
    window.rlotelReadyMs = performance.now();
    document.body.dataset.ready = "1";
  });
})();
