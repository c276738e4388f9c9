// #/models: the caller's model jobs (an admin: everyone's), newest first, a page at a time,
// refreshed while one of them is still tuning.

import { badge, fmt, h, progress, TERMINAL } from "../dom.js";
import { pagedList } from "../list.js";

function table(rows) {
  if (!rows.length) return h("p", { class: "muted" }, "No model jobs yet: `tunefarm tune-model model.py --api URL`.");
  return h("div", { class: "table-wrap" }, h("table", { class: "grid", id: "models-table" },
    h("thead", null, h("tr", null, ["model", "state", "trials", "tasks", "estimated latency", "owner", "created"]
      .map((t) => h("th", null, t)))),
    h("tbody", null, rows.map((m) => h("tr", { dataset: { model: m.id } },
      h("td", null, h("a", { href: `#/models/${m.id}` }, m.name), h("span", { class: "muted" }, ` ${m.id.slice(0, 8)}`)),
      h("td", null, badge(m.state)),
      h("td", null, progress(m.trials_done, m.trials)),
      h("td", { class: "num" }, `${m.tasks.filter((t) => t.done).length} / ${m.tasks.length} done`),
      h("td", { class: "num" }, fmt.seconds(m.estimate_s)),
      h("td", null, m.owner),
      h("td", null, fmt.ago(m.created_at)))))));
}

export function render(view) {
  const list = pagedList({
    url: (cursor) => `/v1/models?${new URLSearchParams({ limit: "50", ...(cursor ? { cursor } : {}) })}`,
    table, active: (m) => !TERMINAL.has(m.state),
  });
  view.append(h("h1", null, "Model jobs"), ...list.nodes);
  list.load(false);
  return list.stop;
}
