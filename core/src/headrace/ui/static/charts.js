/* Tiny SVG charts for the headrace dashboard: line charts and stacked bar charts. No dependency. */
"use strict";
const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 600, H = 180, L = 48, R = 8, T = 8, B = 22;
  const PALETTE = ["#2f6fde", "#e8730c", "#1a9e55", "#b5179e", "#d1242f", "#6f42c1", "#0a8f9c", "#8c6d1f"];

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  function fmt(v) {
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
    return a >= 10 || v === 0 ? String(Math.round(v)) : v.toFixed(2);
  }
  function frame(container, labels, max, unit) {
    container.innerHTML = "";
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" }, container);
    const g = el("g", { class: "grid" }, svg);
    for (let i = 0; i <= 4; i++) {
      const y = T + (H - T - B) * (1 - i / 4);
      el("line", { x1: L, x2: W - R, y1: y, y2: y }, g);
      el("text", { x: L - 4, y: y + 3, "text-anchor": "end" }, svg).textContent = fmt((max * i) / 4) + (i === 4 && unit ? " " + unit : "");
    }
    const n = labels.length;
    const picks = n <= 1 ? [0] : [0, Math.floor((n - 1) / 2), n - 1];
    for (const i of new Set(picks)) {
      if (i >= n) continue;
      const x = xAt(i, n);
      el("text", { x, y: H - 6, "text-anchor": i === 0 ? "start" : i === n - 1 ? "end" : "middle" }, svg).textContent = labels[i];
    }
    return svg;
  }
  function xAt(i, n) { return n <= 1 ? (L + W - R) / 2 : L + ((W - R - L) * i) / (n - 1); }
  function yAt(v, max) { return T + (H - T - B) * (1 - v / max); }
  function legend(container, series) {
    const div = document.createElement("div");
    div.className = "legend";
    series.forEach((s) => {
      const span = document.createElement("span");
      span.innerHTML = `<i style="background:${s.color}"></i>`;
      span.appendChild(document.createTextNode(s.name));
      div.appendChild(span);
    });
    container.appendChild(div);
  }
  function noData(container, text) {
    container.innerHTML = `<div class="nodata"></div>`;
    container.firstChild.textContent = text || "no data yet";
    container.dataset.points = "0";
  }
  /** series: [{name, values: [number|null]}]; labels: x labels (one per point). */
  function line(container, labels, series, opts) {
    opts = opts || {};
    series = series.filter((s) => s.values.some((v) => v != null));
    if (!labels.length || !series.length) return noData(container, opts.empty);
    const max = niceMax(Math.max(...series.flatMap((s) => s.values.filter((v) => v != null))));
    const svg = frame(container, labels, max, opts.unit);
    series.forEach((s, k) => {
      s.color = s.color || PALETTE[k % PALETTE.length];
      const pts = s.values.map((v, i) => (v == null ? null : `${xAt(i, labels.length).toFixed(1)},${yAt(v, max).toFixed(1)}`)).filter(Boolean);
      el("polyline", { points: pts.join(" "), fill: "none", stroke: s.color, "stroke-width": 2, "vector-effect": "non-scaling-stroke" }, svg);
      if (pts.length === 1) { const [x, y] = pts[0].split(","); el("circle", { cx: x, cy: y, r: 3, fill: s.color }, svg); }
    });
    legend(container, series);
    container.dataset.points = String(labels.length);
  }
  /** stacks: [{name, values: [number]}], drawn bottom-up per point. */
  function bars(container, labels, stacks, opts) {
    opts = opts || {};
    if (!labels.length || !stacks.length) return noData(container, opts.empty);
    const totals = labels.map((_, i) => stacks.reduce((a, s) => a + (s.values[i] || 0), 0));
    const max = niceMax(Math.max(...totals));
    const svg = frame(container, labels, max, opts.unit);
    const n = labels.length;
    const bw = Math.max(1, Math.min(24, ((W - R - L) / Math.max(n, 1)) * 0.7));
    stacks.forEach((s, k) => (s.color = s.color || PALETTE[k % PALETTE.length]));
    for (let i = 0; i < n; i++) {
      let base = 0;
      const cx = n <= 1 ? (L + W - R) / 2 : L + bw / 2 + ((W - R - L - bw) * i) / (n - 1);
      for (const s of stacks) {
        const v = s.values[i] || 0;
        if (v <= 0) continue;
        const y0 = yAt(base, max), y1 = yAt(base + v, max);
        const r = el("rect", { x: (cx - bw / 2).toFixed(1), y: y1.toFixed(1), width: bw.toFixed(1), height: Math.max(0.5, y0 - y1).toFixed(1), fill: s.color }, svg);
        el("title", {}, r).textContent = `${labels[i]} ${s.name}: ${fmt(v)}${opts.unit ? " " + opts.unit : ""}`;
        base += v;
      }
    }
    legend(container, stacks);
    container.dataset.points = String(n);
  }
  return { line, bars, fmt, PALETTE };
})();
