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
  /** The y scale: linear from 0 (or from ``lo`` for a value axis such as time), or log10
   * between two powers of ten (rates that differ by orders of magnitude stay readable). */
  function scale(values, opts) {
    const vals = values.filter((v) => v != null && isFinite(v));
    if (opts.log) {
      const pos = vals.filter((v) => v > 0);
      const lo = pos.length ? Math.pow(10, Math.floor(Math.log10(Math.min(...pos)))) : 1;
      let hi = pos.length ? Math.pow(10, Math.ceil(Math.log10(Math.max(...pos)))) : 10;
      if (hi <= lo) hi = lo * 10;
      const span = Math.log10(hi) - Math.log10(lo);
      const step = Math.max(1, Math.ceil(span / 4));
      const ticks = [];
      for (let e = Math.log10(lo); e <= Math.log10(hi) + 1e-9; e += step) ticks.push(Math.pow(10, e));
      // a zero (or negative) value is drawn on the bottom line: below every positive rate
      return { kind: "log", ticks, at: (v) => 1 - (Math.log10(Math.max(v, lo)) - Math.log10(lo)) / span };
    }
    if (opts.from === "min" && vals.length) {
      let lo = Math.min(...vals), hi = Math.max(...vals);
      if (hi <= lo) { lo -= 1; hi += 1; }
      const pad = (hi - lo) * 0.05;
      lo -= pad; hi += pad;
      return { kind: "linear", ticks: [0, 1, 2, 3, 4].map((i) => lo + ((hi - lo) * i) / 4), at: (v) => 1 - (v - lo) / (hi - lo) };
    }
    const max = niceMax(Math.max(0, ...vals));
    return { kind: "linear", ticks: [0, 1, 2, 3, 4].map((i) => (max * i) / 4), at: (v) => 1 - v / max };
  }
  function frame(container, labels, sc, opts) {
    const unit = opts.unit, f = opts.fmt || fmt;
    container.innerHTML = "";
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" }, container);
    const g = el("g", { class: "grid" }, svg);
    sc.ticks.forEach((t, i) => {
      const y = T + (H - T - B) * sc.at(t);
      el("line", { x1: L, x2: W - R, y1: y, y2: y }, g);
      el("text", { x: L - 4, y: y + 3, "text-anchor": "end" }, svg).textContent = f(t) + (i === sc.ticks.length - 1 && unit ? " " + unit : "");
    });
    container.dataset.scale = sc.kind;
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
  function yAt(v, sc) { return T + (H - T - B) * sc.at(v); }
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
  /** series: [{name, values: [number|null]}]; labels: x labels (one per point); opts: unit,
   * empty (the text without data), log (log10 y axis), from: "min" (axis from the lowest
   * value, not 0), fmt (tick label of a value). */
  function line(container, labels, series, opts) {
    opts = opts || {};
    series = series.filter((s) => s.values.some((v) => v != null));
    if (!labels.length || !series.length) return noData(container, opts.empty);
    const sc = scale(series.flatMap((s) => s.values), opts);
    const svg = frame(container, labels, sc, opts);
    series.forEach((s, k) => {
      s.color = s.color || PALETTE[k % PALETTE.length];
      const pts = s.values.map((v, i) => (v == null ? null : `${xAt(i, labels.length).toFixed(1)},${yAt(v, sc).toFixed(1)}`)).filter(Boolean);
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
    const sc = scale(totals, {});
    const svg = frame(container, labels, sc, opts);
    const n = labels.length;
    const bw = Math.max(1, Math.min(24, ((W - R - L) / Math.max(n, 1)) * 0.7));
    stacks.forEach((s, k) => (s.color = s.color || PALETTE[k % PALETTE.length]));
    for (let i = 0; i < n; i++) {
      let base = 0;
      const cx = n <= 1 ? (L + W - R) / 2 : L + bw / 2 + ((W - R - L - bw) * i) / (n - 1);
      for (const s of stacks) {
        const v = s.values[i] || 0;
        if (v <= 0) continue;
        const y0 = yAt(base, sc), y1 = yAt(base + v, sc);
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
