// #/jobs/<id>: one job, live. Every measurement is a point coloured by its result, with the
// best-so-far line and the board's peak where its operator declared one; the records table
// sorts on any column; the best known schedule is shown as Python with a copy button.
// Measurements arrive as server-sent "record" events; when the job ends the page reloads
// its records from SQL (the truth, should Redis have dropped an event).

import { api, apiText, follow } from "../api.js";
import { Chart } from "../chart.js";
import { explainSection, knobLabel } from "../explain.js";
import { badge, clear, errorBox, fill, fmt, h, progress, sortableTable, TERMINAL } from "../dom.js";

export function render(view, { id, me }) {
  const started = performance.now();
  const abort = new AbortController();
  const state = { job: null, flops: 0, nbytes: 0, memoryBound: false, points: [], seen: new Set(), importance: {} };
  const head = h("div");
  const summary = h("div", { class: "summary" });
  const chartHost = h("div", { id: "job-chart" });
  const legend = h("p", { class: "legend" });
  const tableHost = h("div", { id: "records" });
  const bestHost = h("section", { id: "best-schedule" });
  const explain = explainSection({ onDownload: download });
  view.append(head, summary, h("h2", null, "Tuning curve"), chartHost, legend, explain.node,
    h("h2", null, "Records"), tableHost, bestHost);
  let chart = null;
  let table = null;
  let tableKnobs = "";
  let redrawTimer = null;
  let refetchTimer = null;

  // the job's throughput: GB/s for a memory-bound workload (softmax, norms, GEMV: its roof is the
  // memory bandwidth, TUNEFARM_PEAK_GBPS), else GFLOPS against the compute peak
  const rate = () => (state.memoryBound && state.nbytes
    ? { unit: "GB/s", work: state.nbytes, roof: (me.peak_gbps || {})[state.job.device_key] || null, of: "bandwidth" }
    : { unit: "GFLOPS", work: state.flops, roof: (me.peak_gflops || {})[state.job.device_key] || null, of: "peak" });
  const rateOf = (lat) => (lat && rate().work ? rate().work / lat / 1e9 : null);
  const higherIsBetter = () => rate().work > 0;
  const yOf = (p) => (p.latency_s === null ? null : higherIsBetter() ? rateOf(p.latency_s) : p.latency_s * 1e6);
  const peak = () => rate().roof;

  function drawHead() {
    const j = state.job;
    const cancel = TERMINAL.has(j.state) || j.state === "CANCELLING" ? null
      : h("button", { type: "button", id: "cancel", class: "danger", onclick: onCancel }, "Cancel job");
    fill(head, h("h1", null, `Job ${j.id.slice(0, 8)} `, badge(j.state)), cancel);
    const bestG = j.best && rateOf(j.best.latency_s);
    const rows = [
      ["workload", `${fmt.workload(j.workload)}${fmt.params(j.workload) ? ` · ${fmt.params(j.workload)}` : ""}` +
        `${j.task_name ? ` · task ${j.task_name}` : ""} (${j.workload_key})`],
      ["target", `${fmt.target(j.target)} · device ${j.device_key} · space ${j.space}`],
      ["owner", j.owner],
      ["progress", progress(j.trials_done, j.trials)],
      ["best", j.best ? `${fmt.seconds(j.best.latency_s)} · ${fmt.gflops(bestG)} ${rate().unit}` +
        (peak() && bestG ? ` · ${fmt.pct(bestG / peak())} of ${rate().of}` : "") : "no valid measurement yet"],
      ["created", `${new Date(j.created_at).toLocaleString()}` +
        (j.finished_at ? ` · ran ${((Date.parse(j.finished_at) - Date.parse(j.started_at || j.created_at)) / 1000).toFixed(0)} s` : "")],
    ];
    if (j.model_id) rows.push(["model", h("a", { href: `#/models/${j.model_id}` }, j.model_id.slice(0, 8))]);
    if (j.emulated) rows.push(["emulated", h("span", { class: "error-text", id: "emulated" },
      `${j.device_key} is an emulated board: every output is verified there, but its latencies say nothing about a real board`)]);
    if (j.message) rows.push(["waiting", h("span", { class: "error-text" }, j.message)]);
    if (j.error) rows.push(["error", h("span", { class: "error-text" }, j.error)]);
    fill(summary, h("dl", null, rows.map(([k, v]) => [h("dt", null, k), h("dd", { dataset: { field: k } }, v)])));
  }

  function drawChart() {
    const pts = [];
    const line = [];
    let best = null;
    state.points.forEach((p, i) => {
      const y = yOf(p);
      pts.push({ x: i + 1, y: p.invalidity === "ok" ? y : null, kind: p.invalidity, p });
      if (p.invalidity === "ok" && y !== null && (best === null || (higherIsBetter() ? y > best : y < best))) {
        best = y;
        line.push({ x: i + 1, y });
      }
    });
    if (!chart) {
      chart = new Chart(chartHost, {
        yLabel: higherIsBetter() ? rate().unit : "latency (µs)",
        describe: (q) => `#${q.x} ${q.p.trial_id.slice(0, 10)} · ${q.p.invalidity}` +
          (q.y === null ? "" : higherIsBetter() ? ` · ${fmt.gflops(q.y)} ${rate().unit}` : ` · ${fmt.seconds(q.p.latency_s)}`),
      });
    }
    if (higherIsBetter() && peak()) chart.setReference({ y: peak(), label: `${rate().of} ${peak()} ${rate().unit}` });
    chart.setData(pts, line);
    const counts = {};
    for (const p of state.points) counts[p.invalidity] = (counts[p.invalidity] || 0) + 1;
    fill(legend, Object.entries(counts).map(([k, n]) =>
      h("span", { class: "key", dataset: { kind: k } }, h("i", { class: `dot k-${k}` }), `${k} ${n}`)),
      h("span", { class: "key" }, h("i", { class: "dot k-line" }), "best so far"));
    legend.dataset.total = String(state.points.length);
  }

  // a knob's sort key: numbers as they are, a tile by its factors (as text, zero-padded)
  const knobSort = (v) => (v === null || v === undefined ? null
    : Array.isArray(v) ? v.map((x) => String(x).padStart(6, "0")).join(".") : v);

  function tableRows() {
    return state.points.map((p, i) => ({ ...p, n: i + 1, y: yOf(p) }));
  }

  const knobNames = () => [...new Set(state.points.flatMap((p) => Object.keys(p.knobs || {})))];

  function drawTable() {
    const names = knobNames();
    const cols = [
      { label: "#", value: (r) => r.n, num: true },
      { label: "trial", value: (r) => r.trial_id, render: (r) => h("code", { title: r.trial_id }, r.trial_id.slice(0, 10)) },
      { label: "result", value: (r) => r.invalidity, render: (r) => h("span", { class: `k-text-${r.invalidity}` }, r.invalidity) },
      { label: "latency", value: (r) => r.latency_s, render: (r) => fmt.seconds(r.latency_s), num: true },
      { label: rate().unit, value: (r) => rateOf(r.latency_s), render: (r) => fmt.gflops(rateOf(r.latency_s)), num: true, desc: true },
      { label: "predicted", value: (r) => r.predicted_s, render: (r) => fmt.seconds(r.predicted_s), num: true },
      { label: "build", value: (r) => r.build_s, render: (r) => (r.build_s === null ? "–" : `${r.build_s.toFixed(2)} s`), num: true },
      { label: "worker", value: (r) => r.worker_name || r.worker || "",
        render: (r) => (!r.worker ? "–" : r.worker_name
          ? h("a", { href: `#/workers/${r.worker}`, title: r.worker }, r.worker_name)
          : h("span", { title: r.worker }, r.worker)) },
      { label: "measured", value: (r) => r.measured_at, render: (r) => fmt.time(r.measured_at) },
      ...names.map((n) => ({ label: n, cls: "knob", num: true, value: (r) => knobSort(r.knobs && r.knobs[n]),
        render: (r) => knobLabel(r.knobs && r.knobs[n]) })),
    ];
    if (!table || tableKnobs !== names.join("\n")) {  // new knob columns: a new table
      tableKnobs = names.join("\n");
      table = sortableTable(cols, tableRows(), { limit: 500 });
      fill(tableHost, table);
    } else table.update(tableRows());
  }

  function drawExplain() {
    explain.update(state.points, state.importance);
  }

  function redraw() {  // at most every 300 ms while records stream in
    if (redrawTimer) return;
    redrawTimer = setTimeout(() => { redrawTimer = null; drawChart(); drawTable(); drawHead(); drawExplain(); }, 300);
  }

  // While records stream in, the points (with the importance the API computes) are read again
  // at most every 2 s; the events themselves carry each record's knob values.
  function refetchSoon() {
    if (refetchTimer) return;
    refetchTimer = setTimeout(async () => {
      try {
        setPoints(await api(`/v1/jobs/${encodeURIComponent(id)}/points`, { signal: abort.signal }));
        redraw();
      } catch (err) { /* the next event or the final load tries again */ }
      refetchTimer = null;
    }, 2000);
  }

  async function download(kind) {
    const name = `job-${id.slice(0, 8)}.${kind}`;
    const text = kind === "csv" ? await apiText(`/v1/jobs/${encodeURIComponent(id)}/points.csv`)
      : JSON.stringify(await api(`/v1/jobs/${encodeURIComponent(id)}/points`), null, 1);
    const a = h("a", { href: URL.createObjectURL(new Blob([text], { type: kind === "csv" ? "text/csv" : "application/json" })), download: name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }

  async function drawBest() {
    const j = state.job;
    if (!j.best) { clear(bestHost); return; }
    const q = new URLSearchParams({ workload: j.workload_key, target: JSON.stringify(j.target), device_key: j.device_key });
    try {
      const b = await api(`/v1/best?${q}`, { signal: abort.signal });
      const code = h("code", null, b.schedule_python);
      const copied = h("span", { class: "muted", role: "status" });
      const copy = h("button", { type: "button", id: "copy-schedule", onclick: async () => {
        try {
          await navigator.clipboard.writeText(b.schedule_python);
          copied.textContent = "copied";
        } catch (e) {
          const range = document.createRange();
          range.selectNodeContents(code);
          getSelection().removeAllRanges();
          getSelection().addRange(range);
          copied.textContent = "selected: press Ctrl+C";
        }
      } }, "Copy");
      fill(bestHost, h("h2", null, "Best known schedule"),
        h("p", { class: "muted" }, `${fmt.seconds(b.latency_s)} · ${fmt.gflops(rateOf(b.latency_s))} ${rate().unit} · trial ${b.trial_id}` +
          (b.job_id && b.job_id !== j.id ? " (found by another job)" : "")),
        h("div", { class: "code-head" }, copy, copied), h("pre", { class: "code" }, code));
    } catch (err) {
      if (!abort.signal.aborted) fill(bestHost, h("h2", null, "Best known schedule"), errorBox(err));
    }
  }

  function setPoints(pts) {
    const names = Object.keys(pts.knobs || {});
    state.flops = pts.flops;
    state.nbytes = pts.nbytes || 0;
    state.memoryBound = !!pts.memory_bound;
    state.importance = pts.knob_importance || {};
    const known = new Set(pts.trial_id);
    const streamed = state.points.filter((p) => !known.has(p.trial_id));  // newer than the read
    state.points = pts.trial_id.map((t, i) => ({
      trial_id: t, latency_s: pts.latency_s[i], gflops: pts.gflops[i], invalidity: pts.invalidity[i],
      worker: pts.worker[i], worker_name: pts.worker_name[i], build_s: pts.build_s[i], predicted_s: pts.predicted_s[i], measured_at: pts.measured_at[i],
      knobs: Object.fromEntries(names.filter((n) => pts.knobs[n][i] !== null).map((n) => [n, pts.knobs[n][i]])),
    })).concat(streamed);
    state.seen = new Set(state.points.map((p) => p.trial_id));
  }

  async function load() {
    const [job, pts] = await Promise.all([
      api(`/v1/jobs/${encodeURIComponent(id)}`, { signal: abort.signal }),
      api(`/v1/jobs/${encodeURIComponent(id)}/points`, { signal: abort.signal }),
    ]);
    state.job = job;
    setPoints(pts);
    drawHead(); drawChart(); drawTable(); drawExplain(); drawBest();
  }

  function onEvent(ev) {
    const j = state.job;
    if (ev.type === "record" && !state.seen.has(ev.data.trial_id)) {
      state.seen.add(ev.data.trial_id);
      const lat = ev.data.latency_s ?? null;
      const gflops = lat && state.flops ? state.flops / lat / 1e9 : null;
      state.points.push({ trial_id: ev.data.trial_id, latency_s: lat, invalidity: ev.data.invalidity,
        gflops, worker: ev.data.worker ?? null, worker_name: ev.data.worker_name ?? null, build_s: ev.data.build_s ?? null,
        predicted_s: ev.data.predicted_s ?? null, measured_at: new Date().toISOString(),
        knobs: ev.data.knobs && typeof ev.data.knobs === "object" ? ev.data.knobs : {} });
      if (ev.data.invalidity === "ok" && lat !== null && (!j.best || lat < j.best.latency_s)) {
        j.best = { ...(j.best || {}), trial_id: ev.data.trial_id, latency_s: lat, gflops };
      }
      redraw();
      refetchSoon();
    } else if (ev.type === "progress") {
      j.trials_done = Math.max(j.trials_done, ev.data.done ?? j.trials_done);
      if (ev.data.best_s != null && (!j.best || ev.data.best_s < j.best.latency_s)) {
        j.best = { ...(j.best || {}), latency_s: ev.data.best_s, gflops: ev.data.best_gflops ?? null };
      }
      redraw();
    } else if (ev.type === "state") {
      j.state = ev.data.state;
      redraw();
    }
  }

  async function onCancel() {
    try {
      state.job = await api(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
      drawHead();
    } catch (err) {
      summary.append(errorBox(err));
    }
  }

  (async () => {
    try {
      await load();
      await new Promise((res) => requestAnimationFrame(() => requestAnimationFrame(res)));
      view.dataset.renderMs = String(Math.round(performance.now() - started));
      if (!TERMINAL.has(state.job.state)) {
        await follow(id, onEvent, abort.signal);
        if (!abort.signal.aborted) await load();  // the final truth from SQL
      }
      view.dataset.final = "true";
    } catch (err) {
      if (!abort.signal.aborted) view.append(errorBox(err));
    }
  })();
  return () => {
    abort.abort(); clearTimeout(redrawTimer); clearTimeout(refetchTimer);
    if (chart) chart.resize.disconnect();
    explain.dispose();
  };
}
