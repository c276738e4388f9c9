// The job page's "Why it is fast" section: what the knobs did to latency. Drawn with Apache
// ECharts 6.1.0 (vendored in ./vendor from the npm package's dist/echarts.esm.min.mjs, with its
// LICENSE and NOTICE; no CDN): each view is one ECharts instance whose option holds
// exactly the data shown, and each host carries a summary in data-* attributes.
// - knob importance: ω² per knob, as the API computes it (GET /v1/jobs/<id>/points);
// - parallel coordinates: one line per valid measurement across every knob, then latency;
// - a slice: latency against one knob (the most important first; a select picks another);
// - predicted against measured latency: the cost model's prediction when it picked the
//   candidate, with the line where they agree and Spearman's rank correlation.
// `update(points, importance)` redraws them all; the page calls it as records stream in.

import * as echarts from "./vendor/echarts.esm.min.js";
import { fill, h } from "./dom.js";

const US = 1e6;

export function knobLabel(v) {
  if (v === null || v === undefined) return "–";
  return Array.isArray(v) ? v.join("×") : String(v);
}

// The distinct values of a knob in a readable order: numbers ascending, tiles by their factors.
function ordered(values) {
  const seen = new Map();
  for (const v of values) if (v !== null && v !== undefined) seen.set(knobLabel(v), v);
  const cmp = (a, b) => {
    if (typeof a === "number" && typeof b === "number") return a - b;
    if (Array.isArray(a) && Array.isArray(b)) {
      for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] - b[i];
      return a.length - b.length;
    }
    return knobLabel(a) < knobLabel(b) ? -1 : 1;
  };
  return [...seen.values()].sort(cmp).map(knobLabel);
}

function ranks(xs) {
  const idx = xs.map((x, i) => [x, i]).sort((a, b) => a[0] - b[0]);
  const r = new Array(xs.length);
  for (let i = 0; i < idx.length;) {
    let j = i;
    while (j + 1 < idx.length && idx[j + 1][0] === idx[i][0]) j++;
    for (let k = i; k <= j; k++) r[idx[k][1]] = (i + j) / 2;
    i = j + 1;
  }
  return r;
}

export function spearman(xs, ys) {
  if (xs.length < 3) return null;
  const rx = ranks(xs);
  const ry = ranks(ys);
  const mean = (a) => a.reduce((s, v) => s + v, 0) / a.length;
  const mx = mean(rx);
  const my = mean(ry);
  let sxy = 0, sxx = 0, syy = 0;
  for (let i = 0; i < rx.length; i++) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) ** 2;
    syy += (ry[i] - my) ** 2;
  }
  return sxx && syy ? sxy / Math.sqrt(sxx * syy) : null;
}

function chartHost(id, height) {
  const el = h("div", { id, class: "echart" });
  el.style.height = `${height}px`;  // CSSOM: the CSP refuses style attributes
  return el;
}

export function explainSection({ onDownload }) {
  const charts = new Map();
  const observers = [];
  const note = h("p", { class: "muted", id: "explain-note" });
  const impHost = chartHost("knob-importance", 220);
  const parHost = chartHost("knob-parallel", 320);
  const sliceSel = h("select", { id: "slice-knob", "aria-label": "knob" });
  const sliceHost = chartHost("knob-slice", 260);
  const predHost = chartHost("pred-vs-measured", 280);
  const predNote = h("p", { class: "muted", id: "pred-note" });
  const downloads = h("div", { class: "code-head" },
    h("button", { type: "button", id: "download-csv", onclick: () => onDownload("csv") }, "Download CSV"),
    h("button", { type: "button", id: "download-json", onclick: () => onDownload("json") }, "Download JSON"));
  const node = h("section", { id: "explain" },
    h("h2", null, "What the knobs did"), note, downloads,
    h("h3", null, "Knob importance"),
    h("p", { class: "muted" }, "ω² per knob: the share of the variance of log latency over the valid ",
      "measurements that the knob's value alone explains (one-way ANOVA's effect size, corrected ",
      "for the number of values; interactions are not separated, and the search samples what it ",
      "expects to be fast, so read it as what varied with latency in this job)."),
    impHost,
    h("h3", null, "Every valid measurement across the knobs"), parHost,
    h("h3", null, "Latency against one knob ", sliceSel), sliceHost,
    h("h3", null, "Predicted against measured latency"), predNote, predHost);
  let last = { names: [], named: [], importance: {} };

  function chart(el) {
    if (!charts.has(el)) {
      const c = echarts.init(el, null, { renderer: "canvas" });
      const ro = new ResizeObserver(() => c.resize());
      ro.observe(el);
      observers.push(ro);
      charts.set(el, c);
    }
    return charts.get(el);
  }

  const grid = { left: 8, right: 44, top: 30, bottom: 8, containLabel: true };

  function drawImportance(names, importance) {
    const rows = names.map((n) => [n, importance[n] ?? null])
      .sort((a, b) => (b[1] ?? -1) - (a[1] ?? -1));
    impHost.dataset.knobs = JSON.stringify(rows);
    chart(impHost).setOption({
      animation: false, grid, tooltip: { trigger: "axis" },
      xAxis: { type: "value", min: 0, max: 1, name: "ω²" },
      yAxis: { type: "category", inverse: true, data: rows.map((r) => r[0]) },
      series: [{ type: "bar", name: "ω²", data: rows.map((r) => (r[1] === null ? 0 : Number(r[1].toFixed(4)))),
        label: { show: true, position: "right", formatter: (p) => (rows[p.dataIndex][1] === null ? "n/a" : p.value.toFixed(2)) } }],
    }, true);
  }

  function drawParallel(names, valid) {
    const axes = names.map((n, i) => ({ dim: i, name: n, type: "category", data: ordered(valid.map((p) => p.knobs[n])) }));
    const lat = valid.map((p) => p.latency_s * US);
    axes.push({ dim: names.length, name: "latency (µs)", type: "log", nameTextStyle: { fontWeight: "bold" } });
    const data = valid.map((p, i) => [...names.map((n) => knobLabel(p.knobs[n])), Number(lat[i].toPrecision(4))]);
    parHost.dataset.lines = String(data.length);
    parHost.dataset.axes = JSON.stringify(axes.map((a) => a.name));
    chart(parHost).setOption({
      animation: false,
      parallel: { left: 40, right: 70, top: 30, bottom: 24, parallelAxisDefault: { nameLocation: "start", nameGap: 14, nameTextStyle: { fontSize: 11 } } },
      parallelAxis: axes,
      visualMap: lat.length ? { show: false, dimension: names.length, min: Math.min(...lat), max: Math.max(...lat),
        inRange: { color: ["#059669", "#facc15", "#dc2626"] } } : undefined,
      series: [{ type: "parallel", lineStyle: { width: 1, opacity: 0.45 }, data }],
    }, true);
  }

  function drawSlice(names, valid, importance) {
    const keep = sliceSel.dataset.picked;  // the person's choice, else the most important
    const byImp = names.slice().sort((a, b) => (importance[b] ?? -1) - (importance[a] ?? -1));
    fill(sliceSel, byImp.map((n) => h("option", { value: n }, n)));
    sliceSel.value = byImp.includes(keep) ? keep : (byImp[0] || "");
    const knob = sliceSel.value;
    const data = knob ? valid.map((p) => [knobLabel(p.knobs[knob]), Number((p.latency_s * US).toPrecision(4))]) : [];
    sliceHost.dataset.knob = knob;
    sliceHost.dataset.points = String(data.length);
    chart(sliceHost).setOption({
      animation: false, tooltip: { trigger: "item", formatter: (p) => `${knob} ${p.value[0]}: ${p.value[1]} µs` },
      grid: { ...grid, bottom: 28 },
      xAxis: { type: "category", name: knob, nameLocation: "middle", nameGap: 24, data: knob ? ordered(valid.map((p) => p.knobs[knob])) : [] },
      yAxis: { type: "log", name: "latency (µs)", nameTextStyle: { align: "left" } },
      series: [{ type: "scatter", symbolSize: 7, itemStyle: { opacity: 0.6, color: "#2563eb" }, data }],
    }, true);
  }

  function drawPredicted(points) {
    const pairs = points.filter((p) => p.invalidity === "ok" && p.latency_s && p.predicted_s)
      .map((p) => [Number((p.predicted_s * US).toPrecision(4)), Number((p.latency_s * US).toPrecision(4))]);
    const rho = spearman(pairs.map((q) => q[0]), pairs.map((q) => q[1]));
    predHost.dataset.points = String(pairs.length);
    predHost.dataset.spearman = rho === null ? "" : rho.toFixed(3);
    fill(predNote, pairs.length
      ? `${pairs.length} valid measurements with a prediction (the cost model's, when the search picked the candidate)` +
        (rho === null ? "." : `; Spearman's rank correlation ${rho.toFixed(2)}. On the dashed line prediction and measurement agree.`)
      : "No predictions yet: the first batch is sampled before the cost model has measurements to learn from.");
    const all = pairs.flat();
    const lo = all.length ? Math.min(...all) : 1;
    const hi = all.length ? Math.max(...all) : 10;
    chart(predHost).setOption({
      animation: false, tooltip: { trigger: "item", formatter: (p) => (p.seriesIndex ? "" : `predicted ${p.value[0]} µs, measured ${p.value[1]} µs`) },
      grid: { ...grid, bottom: 28 },
      xAxis: { type: "log", name: "predicted (µs)", nameLocation: "middle", nameGap: 24 },
      yAxis: { type: "log", name: "measured (µs)", nameTextStyle: { align: "left" } },
      series: [{ type: "scatter", name: "measured", symbolSize: 7, itemStyle: { opacity: 0.6, color: "#2563eb" }, data: pairs },
        { type: "line", name: "agreement", symbol: "none", silent: true, lineStyle: { type: "dashed", color: "#9ca3af" },
          data: [[lo, lo], [hi, hi]] }],
    }, true);
  }

  function update(points, importance) {
    const names = [...new Set(points.flatMap((p) => Object.keys(p.knobs || {})))];
    const valid = points.filter((p) => p.invalidity === "ok" && p.latency_s && p.knobs);
    const named = valid.filter((p) => names.every((n) => n in p.knobs));
    last = { names, named, importance: importance || {} };
    node.dataset.knobs = String(names.length);
    fill(note, names.length
      ? `${names.length} knobs, named as \`tunefarm spaces\` names them; ${named.length} valid measurements name them all.`
      : "No knob values recorded for this job's records (measured before knobs were named, or committed through MetaSchedule).");
    drawImportance(names, importance || {});
    drawParallel(names, named);
    drawSlice(names, named, importance || {});
    drawPredicted(points);
  }

  sliceSel.addEventListener("change", () => {
    sliceSel.dataset.picked = sliceSel.value;
    drawSlice(last.names, last.named, last.importance);
  });

  function dispose() {
    for (const ro of observers) ro.disconnect();
    for (const c of charts.values()) c.dispose();
  }
  return { node, update, dispose };
}
