// #/compare/<id>,<id>[,...]: two to six jobs overlaid (a template against auto, two layouts,
// two device keys): each job's best latency so far against its trial count, on one log axis,
// and a table of what differs between them. Live: a job still running is followed over its
// events, and its points are read again at most every 2 s while records arrive.

import { api, follow } from "../api.js";
import * as echarts from "../vendor/echarts.esm.min.js";
import { badge, errorBox, fill, fmt, h, TERMINAL } from "../dom.js";

export const MAX_JOBS = 6;
const COLORS = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777"];

const params = (j) => fmt.params(j.workload);

// The best latency so far (µs) after each trial: [[trial, µs], ...] from the first valid one.
export function bestSoFar(pts) {
  const out = [];
  let best = null;
  pts.latency_s.forEach((lat, i) => {
    if (pts.invalidity[i] === "ok" && lat !== null && (best === null || lat < best)) best = lat;
    if (best !== null) out.push([i + 1, Number((best * 1e6).toPrecision(4))]);
  });
  return out;
}

export function render(view, { id }) {
  const abort = new AbortController();
  const ids = [...new Set(String(id).split(","))].filter(Boolean);
  const host = h("div", { id: "compare-chart", class: "echart" });
  host.style.height = "340px";  // CSSOM: the CSP refuses style attributes
  const tableHost = h("div", { id: "compare-table", class: "table-wrap" });
  view.append(h("h1", null, `Compare ${ids.length} jobs`),
    h("p", { class: "muted" }, "Best latency so far against trials measured, per job (log scale)."),
    host, tableHost);
  if (ids.length < 2 || ids.length > MAX_JOBS) {
    view.append(errorBox(new Error(`Pick 2 to ${MAX_JOBS} jobs to compare (on the Jobs page).`)));
    return () => {};
  }
  const chart = echarts.init(host, null, { renderer: "canvas" });
  const ro = new ResizeObserver(() => chart.resize());
  ro.observe(host);
  const jobs = new Map();  // id -> {job, pts}
  const timers = new Map();

  function label(j) {
    return `${j.id.slice(0, 8)} · ${j.space} · ${j.device_key}${params(j) ? ` · ${params(j)}` : ""}`;
  }

  function draw() {
    const rows = ids.filter((i) => jobs.has(i)).map((i) => jobs.get(i));
    const series = rows.map(({ job, pts }, k) => ({
      type: "line", step: "end", name: label(job), symbol: "none", color: COLORS[k % COLORS.length],
      data: bestSoFar(pts),
    }));
    host.dataset.series = JSON.stringify(series.map((s) => ({ name: s.name, points: s.data.length,
      best_us: s.data.length ? s.data[s.data.length - 1][1] : null })));
    chart.setOption({
      animation: false, tooltip: { trigger: "axis" },
      legend: { type: "scroll", top: 0, textStyle: { fontSize: 11 } },
      grid: { left: 8, right: 44, top: 48, bottom: 8, containLabel: true },
      xAxis: { type: "value", name: "trial", minInterval: 1 },
      yAxis: { type: "log", name: "best latency (µs)", nameTextStyle: { align: "left" } },
      series,
    }, true);
    fill(tableHost, h("table", { class: "grid" },
      h("thead", null, h("tr", null, ["job", "state", "workload", "space", "device", "params", "trials", "best"]
        .map((t) => h("th", null, t)))),
      h("tbody", null, rows.map(({ job }) => h("tr", { dataset: { job: job.id } },
        h("td", null, h("a", { href: `#/jobs/${job.id}` }, job.id.slice(0, 8))),
        h("td", null, badge(job.state)),
        h("td", null, fmt.workload(job.workload)),
        h("td", null, job.space),
        h("td", null, job.device_key),
        h("td", null, params(job) || "–"),
        h("td", { class: "num" }, `${job.trials_done} / ${job.trials}`),
        h("td", { class: "num" }, job.best ? fmt.seconds(job.best.latency_s) : "–"))))));
  }

  async function load(jid) {
    const [job, pts] = await Promise.all([
      api(`/v1/jobs/${encodeURIComponent(jid)}`, { signal: abort.signal }),
      api(`/v1/jobs/${encodeURIComponent(jid)}/points`, { signal: abort.signal }),
    ]);
    jobs.set(jid, { job, pts });
    draw();
    return job;
  }

  function reloadSoon(jid) {
    if (timers.has(jid)) return;
    timers.set(jid, setTimeout(async () => {
      try { await load(jid); } catch (err) { /* the next event tries again */ }
      timers.delete(jid);
    }, 2000));
  }

  (async () => {
    try {
      const loaded = await Promise.all(ids.map(load));
      view.dataset.loaded = "true";
      await Promise.all(loaded.filter((j) => !TERMINAL.has(j.state)).map(async (j) => {
        await follow(j.id, (ev) => { if (ev.type === "record" || ev.type === "state") reloadSoon(j.id); }, abort.signal);
        if (!abort.signal.aborted) await load(j.id);
      }));
      view.dataset.final = "true";
    } catch (err) {
      if (!abort.signal.aborted) view.append(errorBox(err));
    }
  })();
  return () => {
    abort.abort();
    for (const t of timers.values()) clearTimeout(t);
    ro.disconnect();
    chart.dispose();
  };
}
