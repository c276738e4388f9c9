// #/models: the caller's model jobs (an admin: everyone's), newest first.

import { api } from "../api.js";
import { badge, fill, errorBox, fmt, h, progress, TERMINAL } from "../dom.js";

export function render(view) {
  const body = h("div");
  let timer = null;
  let gone = false;
  view.append(h("h1", null, "Model jobs"), body);

  async function load() {
    try {
      const page = await api("/v1/models?limit=100");
      if (gone) return;
      const rows = page.items;
      fill(body, rows.length ? h("div", { class: "table-wrap" }, h("table", { class: "grid", id: "models-table" },
        h("thead", null, h("tr", null, ["model", "state", "trials", "tasks", "estimated latency", "owner", "created"]
          .map((t) => h("th", null, t)))),
        h("tbody", null, rows.map((m) => h("tr", null,
          h("td", null, h("a", { href: `#/models/${m.id}` }, m.name), h("span", { class: "muted" }, ` ${m.id.slice(0, 8)}`)),
          h("td", null, badge(m.state)),
          h("td", null, progress(m.trials_done, m.trials)),
          h("td", { class: "num" }, `${m.tasks.filter((t) => t.done).length} / ${m.tasks.length} done`),
          h("td", { class: "num" }, fmt.seconds(m.estimate_s)),
          h("td", null, m.owner),
          h("td", null, fmt.ago(m.created_at)))))))
        : h("p", { class: "muted" }, "No model jobs yet: `tunefarm tune-model model.py --api URL`."));
      if (rows.some((m) => !TERMINAL.has(m.state))) timer = setTimeout(load, 3000);
    } catch (err) {
      if (!gone) fill(body, errorBox(err));
    }
  }
  load();
  return () => { gone = true; clearTimeout(timer); };
}
