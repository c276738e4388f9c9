// A list the API hands out a page at a time ({items, next_cursor}): a "Load more" button reads
// the next page; the first page is read again every few seconds while `active(row)` holds for
// one of its rows (a job or model job still tuning).

import { api } from "./api.js";
import { errorBox, fill, h } from "./dom.js";

export function pagedList({ url, table, active, refreshMs = 3000 }) {
  const body = h("div");
  const more = h("button", { type: "button", hidden: true }, "Load more");
  let rows = [];
  let cursor = null;
  let timer = null;
  let gone = false;

  async function load(append) {
    clearTimeout(timer);
    try {
      const page = await api(url(append ? cursor : null));
      if (gone) return;
      rows = append ? rows.concat(page.items) : page.items;
      cursor = page.next_cursor;
      fill(body, table(rows));
      more.hidden = !cursor;
      if (!append && rows.some(active)) timer = setTimeout(() => load(false), refreshMs);
    } catch (err) {
      if (!gone) fill(body, errorBox(err));
    }
  }
  more.addEventListener("click", () => load(true));
  return { nodes: [body, more], load, stop: () => { gone = true; clearTimeout(timer); } };
}
