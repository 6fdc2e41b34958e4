/* The headrace dashboard: polls /api/queries and the selected query's progress, draws charts. */
"use strict";
(() => {
  const MAX_RECORDS = 300;
  const PHASES = ["latestOffset", "walCommit", "addBatch", "commitOffsets"];
  const state = { refreshMs: 1000, queries: [], selected: null, records: [], lastBatch: null, runIds: null };
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

  function select(key) {
    if (state.selected === key) return;
    state.selected = key; state.records = []; state.lastBatch = null;
    history.replaceState(null, "", "#" + key);
    renderList();
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
    return `<div class="card${wide ? " wide" : ""}"><h3>${esc(title)}</h3><div class="chart" id="${id}"></div></div>`;
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
          <div class="card"><h3>Latest progress</h3><div id="latest"></div></div>
        </div>`;
    }
    $("qtitle").innerHTML = `${esc(st.name || "(unnamed query)")} <span class="badge ${esc(st.status)}">${esc(st.status)}</span>`;
    $("qids").textContent = `id ${st.id || "?"} · run ${st.runId || "?"} · checkpoint ${st.checkpoint}`;
    let status = "";
    if (st.status === "failed") {
      status = `<div class="error" id="error"><b>Batch ${esc(st.batchId)} failed</b>\n${esc(st.exception)}</div>`;
    } else if (st.status === "killed") {
      status = `<div class="note" id="note">The last run (${esc(st.runId)}) ended without a clean stop (killed or crashed); the next start replays its last uncommitted batch.</div>`;
    }
    $("qstatus").innerHTML = status;

    const recs = state.records;
    const labels = recs.map(timeLabel);
    Charts.line($("chart-rates"), labels, [
      { name: "input rows/s", values: recs.map((r) => r.inputRowsPerSecond) },
      { name: "processed rows/s", values: recs.map((r) => r.processedRowsPerSecond) },
    ]);
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
    Charts.line($("chart-latency"), labels, ["P50", "P90", "P99"].map((p) => ({
      name: p, values: recs.map((r) => (r.latencies && r.latencies.e2eLatencyMs ? r.latencies.e2eLatencyMs[p] : null)),
    })), { unit: "ms", empty: "no real-time batch (latencies exist in real-time mode)" });
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
    if (body.progress.length && state.lastBatch != null && body.progress[0].batchId <= state.lastBatch) state.records = [];
    merge(body.progress);
    renderDetail(body.state);
  }

  async function refresh() {
    try {
      state.queries = await (await fetch("/api/queries")).json();
      if (!state.selected || !state.queries.some((q) => q.key === state.selected)) {
        const fromHash = location.hash.slice(1);
        const pick = state.queries.find((q) => q.key === fromHash) || state.queries[0];
        if (pick) select(pick.key);
      }
      renderList();
      await refreshDetail();
      $("updated").textContent = "updated " + new Date().toLocaleTimeString([], { hour12: false });
    } catch (e) {
      $("updated").textContent = "server unreachable (" + e.message + ")";
    }
  }

  async function start() {
    try { state.refreshMs = (await (await fetch("/api/config")).json()).refreshMs || 1000; } catch (e) { /* default */ }
    state.refreshMs = Math.max(100, Number(state.refreshMs) || 1000);  // never poll without a pause
    window.addEventListener("hashchange", () => { const k = location.hash.slice(1); if (k) select(k); });
    await refresh();
    setInterval(refresh, state.refreshMs);
  }
  start();
})();
