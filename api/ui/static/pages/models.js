// #/models: the caller's model jobs (an admin: everyone's), newest first, a page at a time,
// refreshed every few seconds while one of them is still tuning.

import { api } from "../api.js";
import { badge, errorBox, fill, fmt, h, progress, TERMINAL } from "../dom.js";

const REFRESH_MS = 3000;

export function render(view) {
  const body = h("div");
  const more = h("button", { type: "button", hidden: true }, "Load more");
  let rows = [];
  let cursor = null;
  let timer = null;
  let gone = false;
  view.append(h("h1", null, "Model jobs"), body, more);

  function table() {
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

  async function load(append) {
    clearTimeout(timer);
    const q = new URLSearchParams({ limit: "50" });
    if (append && cursor) q.set("cursor", cursor);
    try {
      const page = await api(`/v1/models?${q}`);
      if (gone) return;
      rows = append ? rows.concat(page.items) : page.items;
      cursor = page.next_cursor;
      fill(body, table());
      more.hidden = !cursor;
      if (!append && rows.some((m) => !TERMINAL.has(m.state))) timer = setTimeout(() => load(false), REFRESH_MS);
    } catch (err) {
      if (!gone) fill(body, errorBox(err));
    }
  }
  more.addEventListener("click", () => load(true));
  load(false);
  return () => { gone = true; clearTimeout(timer); };
}
