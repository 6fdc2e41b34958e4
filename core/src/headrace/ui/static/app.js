/* The headrace dashboard: polls /api/queries and the selected query's progress, draws charts. */
"use strict";
(() => {
  const MAX_RECORDS = 300;
  const PHASES = ["latestOffset", "walCommit", "addBatch", "commitOffsets"];
  const TABLE_ROWS = 20;
  const state = { refreshMs: 1000, queries: [], selected: null, records: [], lastBatch: null, runIds: null, openBatch: null, nOps: null, busy: false,
    pipelines: [], pipeline: null, graphFor: null };
  const $ = (id) => document.getElementById(id);

  function esc(s) { const d = document.createElement("div"); d.textContent = s == null ? "" : String(s); return d.innerHTML; }
  function timeLabel(r) { const t = new Date(r.timestamp); return isNaN(t) ? `#${r.batchId}` : t.toLocaleTimeString([], { hour12: false }); }

  function renderList() {
    const ul = $("queries");
    if (!state.queries.length) { ul.innerHTML = '<li class="empty">no query found yet</li>'; return; }
    ul.innerHTML = "";
    for (const q of state.queries) {
      const li = document.createElement("li");
      li.className = "query" + (q.key === state.selected ? " selected" : "");
      li.dataset.key = q.key; li.dataset.status = q.status; li.dataset.name = q.name || "";
      const lp = q.lastProgress;
      const meta = lp ? `batch ${lp.batchId} · ${Charts.fmt(lp.processedRowsPerSecond || 0)} rows/s` : "no batch yet";
      li.innerHTML = `<span class="qname">${esc(q.name || (q.id || "").slice(0, 8) || "(unnamed)")}</span>` +
        `<span class="badge ${esc(q.status)}">${esc(q.status)}</span><span class="qmeta">${esc(meta)}</span>`;
      li.onclick = () => select(q.key);
      ul.appendChild(li);
    }
  }

  function renderPipelines() {
    const ul = $("pipelines");
    if (!state.pipelines.length) { ul.innerHTML = '<li class="empty">no pipeline found</li>'; return; }
    ul.innerHTML = "";
    for (const p of state.pipelines) {
      const li = document.createElement("li");
      li.className = "pipeline" + (p.key === state.pipeline ? " selected" : "");
      li.dataset.key = p.key; li.dataset.name = p.name; li.dataset.state = p.state || "";
      li.innerHTML = `<span class="qname">${esc(p.name || "(unnamed pipeline)")}</span>` +
        `<span class="badge ${esc(badgeOf(p.state))}">${esc((p.state || "no run").toLowerCase())}</span>` +
        `<span class="qmeta">${esc(p.flows.length)} flow${p.flows.length === 1 ? "" : "s"}</span>` +
        `<ul class="flows">${p.flows.map((f) => `<li class="flow" data-flow="${esc(f.name)}"${f.queryKey ? ` data-query="${esc(f.queryKey)}"` : ""}>` +
          `<span class="badge ${esc(badgeOf(f.status))}">${esc((f.status || "?").toLowerCase())}</span>${esc(f.name)}</li>`).join("")}</ul>`;
      li.onclick = (ev) => {
        const fl = ev.target.closest("li.flow[data-query]");
        if (fl) select(fl.dataset.query); else selectPipeline(p.key);
      };
      ul.appendChild(li);
    }
  }
  function badgeOf(s) {
    return { RUNNING: "running", STARTING: "running", COMPLETED: "finished", FAILED: "failed", CANCELED: "killed",
             STOPPED: "killed", SKIPPED: "unknown" }[s] || "unknown";
  }

  function selectPipeline(key) {
    state.selected = null; state.pipeline = key; state.graphFor = null;
    history.replaceState(null, "", "#p:" + key);
    renderList(); renderPipelines(); renderPipeline();
  }

  function renderPipeline() {
    const p = state.pipelines.find((x) => x.key === state.pipeline);
    const main = $("detail");
    if (!p) { main.innerHTML = '<p class="empty">this pipeline is gone</p>'; return; }
    if (!main.querySelector("#pipeline-flows") || main.dataset.pipeline !== p.key) {
      main.dataset.pipeline = p.key;
      main.innerHTML = `<h2 id="ptitle"></h2><div class="ids" id="pids"></div>
        <div class="card wide"><h3>Flow graph</h3><div id="pipeline-graph"></div></div>
        <h3 class="section">Flows</h3><div class="card wide"><div id="pipeline-flows"></div></div>`;
    }
    $("ptitle").innerHTML = `${esc(p.name)} <span class="badge ${esc(badgeOf(p.state))}">${esc((p.state || "no run").toLowerCase())}</span>`;
    $("pids").textContent = `update ${p.updateId || "?"} · ${p.timestamp || ""} · storage ${p.storage}`;
    const graphKey = `${p.key}:${p.updateId}`;
    if (state.graphFor !== graphKey) {
      state.graphFor = graphKey;
      $("pipeline-graph").innerHTML = p.hasGraph
        ? `<img id="pipeline-svg" alt="flow graph of ${esc(p.name)}" src="/api/pipelines/${encodeURIComponent(p.key)}/graph.svg?u=${encodeURIComponent(p.updateId || "")}">`
        : '<p class="empty">no flow graph in the event log yet (a run records it)</p>';
      const img = $("pipeline-svg");
      if (img) img.onerror = async () => {
        let why = "the graph could not be drawn";
        try { why = (await (await fetch(img.src)).json()).error || why; } catch (e) { /* keep the default */ }
        $("pipeline-graph").innerHTML = `<p class="empty"></p>`;
        $("pipeline-graph").firstChild.textContent = why;
      };
    }
    const rows = p.flows.map((f) => `<tr data-flow="${esc(f.name)}"><td>${f.queryKey ? `<a href="#${esc(f.queryKey)}">${esc(f.name)}</a>` : esc(f.name)}</td>` +
      `<td>${esc(f.dataset)}</td><td><span class="badge ${esc(badgeOf(f.status))}">${esc((f.status || "?").toLowerCase())}</span></td>` +
      `<td>${esc(f.batches)}</td><td>${esc(f.outputRows)}</td>` +
      `<td class="expectations">${f.expectations.map((x) => `<span class="exp${x.failed ? " failing" : ""}">${esc(x.name)}: ${esc(x.passed)} passed, ${esc(x.failed)} failed</span>`).join("<br>")}</td>` +
      `<td>${esc(f.droppedRecords)}</td><td class="flow-error">${esc(f.error || "")}</td></tr>`);
    $("pipeline-flows").innerHTML = rows.length ? `<table class="batches flows"><thead><tr><th>flow</th><th>dataset</th><th>status</th>` +
      `<th>batches</th><th>output rows</th><th>expectations</th><th>dropped</th><th>error</th></tr></thead><tbody>${rows.join("")}</tbody></table>`
      : '<p class="empty">no flow has run yet</p>';
  }

  function select(key) {
    if (state.selected === key) return;
    state.pipeline = null; delete $("detail").dataset.pipeline;
    state.selected = key; state.records = []; state.lastBatch = null; state.openBatch = null; state.nOps = null;
    history.replaceState(null, "", "#" + key);
    renderList(); renderPipelines();
    $("detail").innerHTML = '<p class="empty">loading…</p>';
    refreshDetail();
  }

  function merge(records) {
    if (!records.length) return;
    // a checkpoint reset replays batch ids: drop what the new records supersede
    const first = records[0].batchId;
    state.records = state.records.filter((r) => r.batchId < first).concat(records).slice(-MAX_RECORDS);
    state.lastBatch = state.records[state.records.length - 1].batchId;
  }

  function flatten(obj, prefix, out) {
    for (const [k, v] of Object.entries(obj || {})) {
      const key = prefix ? `${prefix}.${k}` : k;
      if (v && typeof v === "object" && !Array.isArray(v)) flatten(v, key, out);
      else if (Array.isArray(v) && v.length && typeof v[0] === "object") v.forEach((x, i) => flatten(x, `${key}[${i}]`, out));
      else out.push([key, typeof v === "object" ? JSON.stringify(v) : v]);
    }
    return out;
  }

  function card(id, title, wide) {
    return `<div class="card${wide ? " wide" : ""}" id="card-${id.replace(/^chart-/, "")}"><h3>${esc(title)}</h3><div class="chart" id="${id}"></div></div>`;
  }
  const num = (v) => (typeof v === "number" && isFinite(v) ? v : null);
  const msOf = (iso) => { const t = iso ? Date.parse(iso) : NaN; return isNaN(t) ? null : t; };
  function clock(ms) { return new Date(ms).toISOString().slice(11, 19); }
  function bytes(v) {
    const a = Math.abs(v);
    if (a >= 1 << 30) return (v / (1 << 30)).toFixed(1) + " GiB";
    if (a >= 1 << 20) return (v / (1 << 20)).toFixed(1) + " MiB";
    if (a >= 1 << 10) return (v / (1 << 10)).toFixed(1) + " KiB";
    return Math.round(v) + " B";
  }

  /** One card per chart of each stateful operator (Spark's stateOperators), and the watermark. */
  function renderState(recs, labels) {
    const nOps = Math.max(0, ...recs.map((r) => (r.stateOperators || []).length));
    const hasWm = recs.some((r) => r.eventTime && r.eventTime.watermark);
    const section = $("state");
    section.hidden = !nOps && !hasWm;
    if (`${nOps}:${hasWm}` !== state.nOps) {
      state.nOps = `${nOps}:${hasWm}`;
      const names = Array.from({ length: nOps }, (_, i) => {
        const r = recs.slice().reverse().find((x) => (x.stateOperators || [])[i]);
        return `${i}: ${(r && r.stateOperators[i].operatorName) || "stateful operator"}`;
      });
      $("state-grid").innerHTML = (hasWm ? card("chart-watermark", "Watermark (event time, UTC)") : "") +
        names.map((n, i) => card(`chart-state-rows-${i}`, `${n} · rows in state`) +
          card(`chart-state-memory-${i}`, `${n} · state memory`) +
          card(`chart-state-dropped-${i}`, `${n} · rows dropped by the watermark`)).join("");
    }
    if (hasWm) Charts.line($("chart-watermark"), labels, [
      // 1970-01-01 (0) is Spark's "no watermark yet": not a point on a time axis
      { name: "watermark", values: recs.map((r) => msOf((r.eventTime || {}).watermark) || null) },
      { name: "max event time", values: recs.map((r) => msOf((r.eventTime || {}).max)) },
    ], { from: "min", fmt: clock, empty: "no watermark" });
    for (let i = 0; i < nOps; i++) {
      const op = (r) => (r.stateOperators || [])[i] || {};
      Charts.line($(`chart-state-rows-${i}`), labels, [
        { name: "rows in state", values: recs.map((r) => num(op(r).numRowsTotal)) },
        { name: "updated", values: recs.map((r) => num(op(r).numRowsUpdated)) },
        { name: "removed", values: recs.map((r) => num(op(r).numRowsRemoved)) },
      ]);
      Charts.line($(`chart-state-memory-${i}`), labels, [
        { name: "memory used", values: recs.map((r) => num(op(r).memoryUsedBytes)) },
      ], { fmt: bytes });
      Charts.line($(`chart-state-dropped-${i}`), labels, [
        { name: "rows dropped by the watermark", values: recs.map((r) => num(op(r).numRowsDroppedByWatermark)), color: "#d1242f" },
      ], { empty: "this operator reports no late rows" });
    }
  }

  /** The last batches, newest first; a click opens the batch's whole progress record. */
  function renderBatches(recs) {
    const rows = recs.slice(-TABLE_ROWS).reverse().map((r) => {
      const d = r.durationMs || {};
      const phases = Object.entries(d).filter(([k, v]) => k !== "triggerExecution" && v > 0)
        .map(([k, v]) => `${k} ${v}`).join(" · ");
      const wm = (r.eventTime || {}).watermark;
      return `<tr data-batch="${esc(r.batchId)}"${state.openBatch === r.batchId ? ' class="open"' : ""}>` +
        `<td>${esc(r.batchId)}</td><td>${esc(timeLabel(r))}</td><td>${esc(r.numInputRows)}</td>` +
        `<td>${esc((r.sink || {}).numOutputRows)}</td><td>${esc(d.triggerExecution)}</td><td class="phases">${esc(phases)}</td>` +
        `<td>${esc(Charts.fmt(r.inputRowsPerSecond || 0))}</td><td>${esc(Charts.fmt(r.processedRowsPerSecond || 0))}</td>` +
        `<td>${esc(wm ? wm.replace("T", " ").replace(/\.\d+Z$|Z$/, "") : "")}</td></tr>`;
    });
    $("batches").innerHTML = rows.length ? `<table class="batches"><thead><tr><th>batch</th><th>time</th><th>input rows</th>` +
      `<th>output rows</th><th>duration ms</th><th>by phase (ms)</th><th>input rows/s</th><th>processed rows/s</th>` +
      `<th>watermark</th></tr></thead><tbody>${rows.join("")}</tbody></table>` : '<p class="empty">no batch yet</p>';
    const open = state.openBatch == null ? null : recs.find((r) => r.batchId === state.openBatch);
    const box = $("batch-record");
    if (!open) { box.hidden = true; box.dataset.batch = ""; return; }
    if (box.dataset.batch !== String(open.batchId)) {
      box.innerHTML = `<h3>Batch ${esc(open.batchId)}: progress record <button type="button" id="batch-close">close</button></h3>` +
        `<pre id="batch-json"></pre>`;
      $("batch-json").textContent = JSON.stringify(open, null, 2);
      $("batch-close").onclick = () => { state.openBatch = null; renderBatches(state.records); };
      box.dataset.batch = String(open.batchId);
    }
    box.hidden = false;
  }

  function renderDetail(st) {
    const main = $("detail");
    if (!main.querySelector("#chart-rates")) {
      main.innerHTML = `<h2 id="qtitle"></h2><div class="ids" id="qids"></div><div id="qstatus"></div>
        <div class="grid">
          ${card("chart-rates", "Input rate vs processing rate (rows/s)")}
          ${card("chart-phases", "Batch duration by phase (ms)")}
          ${card("chart-rows", "Rows per batch")}
          ${card("chart-backlog", "Source backlog")}
          ${card("chart-latency", "Real-time latency percentiles (e2e, ms)")}
        </div>
        <section id="state" hidden><h3 class="section">State</h3><div class="grid" id="state-grid"></div></section>
        <section><h3 class="section">Recent batches</h3><div class="card wide"><div id="batches"></div>
          <div id="batch-record" hidden></div></div></section>
        <section><h3 class="section">Latest progress</h3><div class="card wide"><div id="latest"></div></div></section>`;
      $("batches").addEventListener("click", (ev) => {
        const tr = ev.target.closest("tr[data-batch]");
        if (!tr) return;
        const id = Number(tr.dataset.batch);
        state.openBatch = state.openBatch === id ? null : id;
        renderBatches(state.records);
      });
    }
    $("qtitle").innerHTML = `${esc(st.name || "(unnamed query)")} <span class="badge ${esc(st.status)}">${esc(st.status)}</span>`;
    $("qids").textContent = `id ${st.id || "?"} · run ${st.runId || "?"} · checkpoint ${st.checkpoint}`;
    let status = "";
    if (st.status === "failed") {
      status = `<div class="error" id="error"><b>Batch ${esc(st.batchId)} failed</b>\n${esc(st.exception)}</div>` +
        (st.traceback ? `<details class="traceback" open><summary>Traceback</summary><pre id="traceback">${esc(st.traceback)}</pre></details>` : "");
    } else if (st.status === "killed") {
      status = `<div class="note" id="note">The last run (${esc(st.runId)}) ended without a clean stop (killed or crashed); the next start replays its last uncommitted batch.</div>`;
    }
    $("qstatus").innerHTML = status;

    const recs = state.records;
    const labels = recs.map(timeLabel);
    // log scale: input and processing rates often differ by orders of magnitude (a batch of
    // 2,000 rows every 250 ms is 8k rows/s in, and 1M rows/s processed when it takes 2 ms)
    Charts.line($("chart-rates"), labels, [
      { name: "input rows/s", values: recs.map((r) => r.inputRowsPerSecond) },
      { name: "processed rows/s", values: recs.map((r) => r.processedRowsPerSecond) },
    ], { log: true });
    const phases = PHASES.concat(Array.from(new Set(recs.flatMap((r) => Object.keys(r.durationMs || {})))).filter(
      (p) => !PHASES.includes(p) && p !== "triggerExecution"));
    Charts.bars($("chart-phases"), labels, phases.filter((p) => recs.some((r) => (r.durationMs || {})[p] > 0))
      .map((p) => ({ name: p, values: recs.map((r) => (r.durationMs || {})[p] || 0) })), { unit: "ms" });
    const badOf = (r) => {
      const all = (r.sources || []).map((x) => x.metrics || {}).concat([(r.sink || {}).metrics || {}]);
      const found = all.filter((m) => typeof m.numBadRecords === "number");
      const sinkM = (r.sink || {}).metrics || {};
      const t = typeof sinkM.transformBadRecords === "number" ? sinkM.transformBadRecords : null;
      if (!found.length) return t;
      return found.reduce((a, m) => a + m.numBadRecords, 0) + (t || 0);
    };
    Charts.line($("chart-rows"), labels, [
      { name: "input rows", values: recs.map((r) => r.numInputRows) },
      { name: "output rows", values: recs.map((r) => (r.sink || {}).numOutputRows) },
      { name: "bad records", values: recs.map(badOf), color: "#d1242f" },
    ]);
    const backlogKeys = [];
    for (const r of recs) (r.sources || []).forEach((s, i) => {
      for (const [k, v] of Object.entries(s.metrics || {})) {
        const name = (r.sources.length > 1 ? `${i}: ` : "") + k;
        if (typeof v === "number" && !backlogKeys.some((b) => b.name === name)) backlogKeys.push({ name, i, k });
      }
    });
    Charts.line($("chart-backlog"), labels, backlogKeys.map((b) => ({
      name: b.name, values: recs.map((r) => { const m = ((r.sources || [])[b.i] || {}).metrics || {}; return typeof m[b.k] === "number" ? m[b.k] : null; }),
    })), { empty: "the sources report no backlog metric" });
    const realTime = recs.some((r) => r.latencies && r.latencies.e2eLatencyMs);
    $("card-latency").hidden = !realTime;  // latencies exist in real-time mode only
    if (realTime) Charts.line($("chart-latency"), labels, ["P50", "P90", "P99"].map((p) => ({
      name: p, values: recs.map((r) => (r.latencies && r.latencies.e2eLatencyMs ? r.latencies.e2eLatencyMs[p] : null)),
    })), { unit: "ms" });
    renderState(recs, labels);
    renderBatches(recs);
    const last = recs[recs.length - 1];
    $("latest").innerHTML = last
      ? `<table class="kv">${flatten(last, "", []).map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(v)}</td></tr>`).join("")}</table>`
      : '<p class="empty">no batch yet</p>';
    $("latest").dataset.batch = last ? String(last.batchId) : "";
  }

  async function refreshDetail() {
    const key = state.selected;
    if (!key) return;
    const after = state.lastBatch == null ? "" : String(state.lastBatch);
    const res = await fetch(`/api/queries/${encodeURIComponent(key)}/progress?after=${after}`);
    if (key !== state.selected) return;
    if (!res.ok) { $("detail").innerHTML = '<p class="empty">this query is gone</p>'; return; }
    const body = await res.json();
    merge(body.progress);  // replaces what a replayed batch id supersedes
    renderDetail(body.state);
  }

  async function refresh() {
    if (state.busy) return;  // a slow poll is not overlapped by the next one
    state.busy = true;
    try {
      const [qs, ps] = await Promise.all([fetch("/api/queries"), fetch("/api/pipelines")]);
      state.queries = await qs.json();
      state.pipelines = ps.ok ? await ps.json() : [];
      const fromHash = location.hash.slice(1);
      if (!state.pipeline && fromHash.startsWith("p:") && state.pipelines.some((p) => p.key === fromHash.slice(2))) {
        selectPipeline(fromHash.slice(2));
      }
      if (!state.pipeline && (!state.selected || !state.queries.some((q) => q.key === state.selected))) {
        const pick = state.queries.find((q) => q.key === fromHash) || state.queries[0];
        if (pick) select(pick.key);
      }
      renderList();
      renderPipelines();
      if (state.pipeline) renderPipeline(); else await refreshDetail();
      $("updated").textContent = "updated " + new Date().toLocaleTimeString([], { hour12: false });
    } catch (e) {
      $("updated").textContent = "server unreachable (" + e.message + ")";
    } finally {
      state.busy = false;
    }
  }

  async function start() {
    try { state.refreshMs = (await (await fetch("/api/config")).json()).refreshMs || 1000; } catch (e) { /* default */ }
    state.refreshMs = Math.max(100, Number(state.refreshMs) || 1000);  // never poll without a pause
    window.addEventListener("hashchange", () => {
      const k = location.hash.slice(1);
      if (k.startsWith("p:")) selectPipeline(k.slice(2)); else if (k) select(k);
    });
    await refresh();
    setInterval(refresh, state.refreshMs);
  }
  start();
})();
