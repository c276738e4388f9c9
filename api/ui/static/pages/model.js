// #/models/<id>: a model job: the estimated model latency after each round, and each task's
// progress (its weight, its trials, its best latency). Polled while the model is tuning.

import { api } from "../api.js";
import { Chart } from "../chart.js";
import { badge, fill, errorBox, fmt, h, progress, sortableTable, TERMINAL } from "../dom.js";

export function render(view, { id }) {
  const head = h("div");
  const chartHost = h("div", { id: "model-chart" });
  const tasksHost = h("div", { id: "model-tasks" });
  view.append(head, h("h2", null, "Estimated model latency"), chartHost, h("h2", null, "Tasks"), tasksHost);
  const chart = new Chart(chartHost, {
    height: 220, xLabel: "trials spent", yLabel: "latency (µs)", extendLine: false, zero: false,
    step: false, describe: (p) => `${p.x} trials · ${fmt.seconds(p.y / 1e6)}`,
  });
  let timer = null;
  let gone = false;

  function draw(m) {
    const cancel = TERMINAL.has(m.state) || m.state === "CANCELLING" ? null
      : h("button", { type: "button", class: "danger", onclick: async () => {
        try { draw(await api(`/v1/models/${encodeURIComponent(id)}/cancel`, { method: "POST" })); } catch (err) { head.append(errorBox(err)); }
      } }, "Cancel model job");
    fill(head, h("h1", null, `Model ${m.name} `, badge(m.state)), cancel,
      h("dl", null,
        h("dt", null, "progress"), h("dd", null, progress(m.trials_done, m.trials)),
        h("dt", null, "estimate"), h("dd", { dataset: { field: "estimate" } }, fmt.seconds(m.estimate_s)),
        h("dt", null, "target"), h("dd", null, `${fmt.target(m.target)} · device ${m.device_key} · rounds of ${m.round_trials}`),
        h("dt", null, "status"), h("dd", null, m.message || "–"),
        m.error ? [h("dt", null, "error"), h("dd", { class: "error-text" }, m.error)] : null));
    const pts = m.estimates.filter(([, e]) => e !== null).map(([t, e]) => ({ x: t, y: e * 1e6, kind: "estimate" }));
    chart.setData(pts, pts.map((p) => ({ x: p.x, y: p.y })));
    const spent = Math.max(1, m.tasks.reduce((a, t) => a + t.trials_done, 0));
    const cols = [
      { label: "task", value: (t) => t.name },
      { label: "weight", value: (t) => t.weight, num: true, desc: true },
      { label: "state", value: (t) => t.state || "", render: (t) => (t.job_id ? h("a", { href: `#/jobs/${t.job_id}` }, badge(t.state || "–")) : "waiting") },
      { label: "trials", value: (t) => t.trials_done, num: true, desc: true, render: (t) => {
        const bar = h("span", { class: "fill" });
        bar.style.width = `${(100 * t.trials_done / spent).toFixed(1)}%`;
        return h("span", { class: "progress" }, h("span", { class: "bar" }, bar), h("span", { class: "num" }, String(t.trials_done)));
      } },
      { label: "earlier", value: (t) => t.prior_trials, num: true },
      { label: "best latency", value: (t) => t.best_s, render: (t) => fmt.seconds(t.best_s), num: true },
      { label: "share of model", value: (t) => (t.best_s === null ? null : t.best_s * t.weight), num: true, desc: true,
        render: (t) => (t.best_s === null || !m.estimate_s ? "–" : fmt.pct(t.best_s * t.weight / m.estimate_s)) },
      { label: "done", value: (t) => (t.done ? 1 : 0), render: (t) => (t.done ? "yes" : "") },
      { label: "why untuned", value: (t) => (t.untuned ? t.error || "no valid record" : ""),
        render: (t) => (t.untuned ? h("span", { class: "error-text" }, t.error || "no valid record") : "") },
    ];
    const untuned = m.tasks.filter((t) => t.untuned);
    if (untuned.length) {
      head.append(h("p", { class: "error-text", dataset: { field: "untuned" } },
        `${untuned.length} of ${m.tasks.length} tasks have no valid record: a build gives them relax's default loops.`));
    }
    fill(tasksHost, sortableTable(cols, m.tasks, { sortBy: 6, desc: true }));
  }

  async function load() {
    try {
      const m = await api(`/v1/models/${encodeURIComponent(id)}`);
      if (gone) return;
      draw(m);
      if (!TERMINAL.has(m.state)) timer = setTimeout(load, 2000);
    } catch (err) {
      if (!gone) fill(head, errorBox(err));
    }
  }
  load();
  return () => { gone = true; clearTimeout(timer); chart.resize.disconnect(); };
}
