// #/best: the best known schedule of every workload on every target, with how much faster it
// is than the first valid candidate measured there; a row opens its schedule as Python.

import { api } from "../api.js";
import { fill, errorBox, fmt, h, sortableTable } from "../dom.js";

export function render(view, { me }) {
  const op = h("input", { id: "b-op", placeholder: "op", "aria-label": "op", pattern: "[a-z][a-z0-9_]*" });
  const body = h("div", { id: "best-table" });
  const schedule = h("section", { id: "best-detail" });
  let gone = false;
  // a model's PrimFunc by the names of its tasks in the caller's models; an op by its spec
  const name = (r) => (r.task_names.length ? r.task_names.join(", ") : r.description || r.workload_key);
  const peakOf = (r) => (me.peak_gflops || {})[r.device_key] || null;

  async function open(r) {
    const q = new URLSearchParams({ workload: r.workload_key, target: JSON.stringify(r.target), device_key: r.device_key });
    try {
      const b = await api(`/v1/best?${q}`);
      fill(schedule, h("h2", null, `${name(r)} on ${fmt.target(r.target)}`),
        h("p", { class: "muted" }, `${fmt.seconds(b.latency_s)} · ${fmt.gflops(b.gflops)} GFLOPS · trial ${b.trial_id}`),
        h("pre", { class: "code" }, h("code", null, b.schedule_python)));
      schedule.scrollIntoView({ block: "nearest" });
    } catch (err) {
      fill(schedule, errorBox(err));
    }
  }

  async function load(e) {
    if (e) e.preventDefault();
    try {
      const q = new URLSearchParams({ limit: "500" });
      if (op.value.trim()) q.set("op", op.value.trim());
      const rows = await api(`/v1/workloads?${q}`);
      if (gone) return;
      // the numbers first, the long names cut to one line (the whole in a tooltip), the
      // bookkeeping columns last and off on a phone: the table fits the page at 1280 px
      const cols = [
        { label: "workload", value: name, cls: "name",
          render: (r) => h("div", { title: `${r.description}\n${r.workload_key}` },
            h("button", { type: "button", class: "link", onclick: () => open(r) }, name(r)),
            r.task_names.length ? h("div", { class: "muted sig" }, r.description) : null) },
        { label: "best", value: (r) => r.best_s, render: (r) => fmt.seconds(r.best_s), num: true },
        { label: "GFLOPS", value: (r) => r.best_gflops, render: (r) => fmt.gflops(r.best_gflops), num: true, desc: true },
        { label: "of peak", value: (r) => (peakOf(r) && r.best_gflops ? r.best_gflops / peakOf(r) : null),
          render: (r) => (peakOf(r) && r.best_gflops ? fmt.pct(r.best_gflops / peakOf(r)) : "–"), num: true, desc: true },
        { label: "vs first", value: (r) => r.speedup, render: (r) => `${r.speedup.toFixed(2)}×`, num: true, desc: true },
        { label: "target", value: (r) => `${fmt.target(r.target)} ${r.device_key}`, render: (r) => `${fmt.target(r.target)} · ${r.device_key}` },
        { label: "op", value: (r) => r.op, cls: "wide-only" },
        { label: "records", value: (r) => r.records, render: (r) => `${r.valid} / ${r.records}`, num: true, desc: true, cls: "wide-only" },
        { label: "last measured", value: (r) => r.last_measured_at, render: (r) => fmt.ago(r.last_measured_at), desc: true, cls: "wide-only" },
      ];
      fill(body, rows.length ? sortableTable(cols, rows, { sortBy: 8, desc: true })
        : h("p", { class: "muted" }, "Nothing measured yet."));
    } catch (err) {
      if (!gone) fill(body, errorBox(err));
    }
  }
  view.append(h("h1", null, "Best schedules"),
    h("form", { class: "filters", onsubmit: load }, op, h("button", { type: "submit" }, "Filter")), body, schedule);
  load();
  return () => { gone = true; };
}
