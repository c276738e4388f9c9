// #/jobs: the caller's jobs (an admin: everyone's), filtered by state, op and (admin) owner,
// refreshed every few seconds while any of them is still running.

import { badge, fmt, h, progress, TERMINAL } from "../dom.js";
import { pagedList } from "../list.js";
import { MAX_JOBS } from "./compare.js";

const STATES = ["", "QUEUED", "RUNNING", "CANCELLING", "SUCCEEDED", "FAILED", "CANCELLED"];

export function render(view, { me }) {
  const params = new URLSearchParams(sessionStorage.getItem("tunefarm.jobs.filter") || "");
  const state = h("select", { id: "f-state", "aria-label": "state" },
    STATES.map((s) => h("option", { value: s, selected: params.get("state") === s }, s || "any state")));
  const op = h("input", { id: "f-op", placeholder: "op (matmul, conv2d, tir…)", value: params.get("op") || "",
    "aria-label": "op", pattern: "[a-z][a-z0-9_]*" });
  const owner = me.scope === "admin"
    ? h("input", { id: "f-owner", placeholder: "owner", value: params.get("owner") || "", "aria-label": "owner" })
    : null;

  function query(extra) {
    const q = new URLSearchParams({ limit: "50" });
    if (state.value) q.set("state", state.value);
    if (op.value.trim()) q.set("op", op.value.trim());
    if (owner && owner.value.trim()) q.set("owner", owner.value.trim());
    if (extra) q.set("cursor", extra);
    return q;
  }

  // jobs ticked for #/compare (kept across the list's refreshes)
  const picked = new Set();
  const compareBtn = h("button", { type: "button", id: "compare", disabled: true,
    onclick: () => { location.hash = `#/compare/${[...picked].join(",")}`; } }, "Compare selected");
  function pick(id, on) {
    if (on) picked.add(id); else picked.delete(id);
    compareBtn.disabled = picked.size < 2 || picked.size > MAX_JOBS;
    compareBtn.textContent = picked.size ? `Compare selected (${picked.size})` : "Compare selected";
  }

  function table(rows) {
    if (!rows.length) return h("p", { class: "muted" }, "No jobs match. Submit one with `tunefarm submit matmul --shape 256,256,256`.");
    return h("div", { class: "table-wrap" }, h("table", { class: "grid", id: "jobs-table" },
      h("thead", null, h("tr", null, ["", "job", "workload", "state", "progress", "best GFLOPS", "device", "owner", "created"]
        .map((t) => h("th", null, t)))),
      h("tbody", null, rows.map((j) => h("tr", { dataset: { job: j.id } },
        h("td", { class: "compare-pick" }, h("input", { type: "checkbox", "aria-label": `compare ${j.id.slice(0, 8)}`,
          checked: picked.has(j.id), onchange: (e) => pick(j.id, e.target.checked) })),
        h("td", null, h("a", { href: `#/jobs/${j.id}` }, j.id.slice(0, 8))),
        h("td", { class: "workload" }, fmt.workload(j.workload),
          j.task_name ? h("span", { class: "task", title: "the model task this job tunes" }, ` ${j.task_name}`)
            : j.model_id ? h("span", { class: "muted" }, " (model task)") : "",
          fmt.params(j.workload) ? h("div", { class: "muted sig" }, fmt.params(j.workload)) : ""),
        h("td", null, badge(j.state)),
        h("td", null, progress(j.trials_done, j.trials)),
        h("td", { class: "num" }, fmt.gflops(j.best && j.best.gflops)),
        h("td", null, j.device_key),
        h("td", null, j.owner),
        h("td", null, fmt.ago(j.created_at)))))));
  }

  const list = pagedList({ url: (cursor) => `/v1/jobs?${query(cursor)}`, table,
    active: (j) => !TERMINAL.has(j.state) });

  function refilter(e) {
    if (e) e.preventDefault();
    sessionStorage.setItem("tunefarm.jobs.filter", query().toString());
    list.load(false);
  }
  state.addEventListener("change", refilter);
  const form = h("form", { class: "filters", onsubmit: refilter }, state, op, owner,
    h("button", { type: "submit" }, "Filter"), compareBtn);
  view.append(h("h1", null, "Jobs"), form, ...list.nodes);
  list.load(false);
  return list.stop;
}
