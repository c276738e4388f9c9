// #/workers and #/workers/<id>: the farm's workers: state (a quarantined worker stands out),
// device key, last heartbeat, throughput and failures; a worker's page adds its target and
// capabilities. Refreshed every few seconds.

import { api } from "../api.js";
import { badge, fill, errorBox, fmt, h } from "../dom.js";

const REFRESH_MS = 3000;

function list(ws) {
  if (!ws.length) return h("p", { class: "muted" }, "No worker has registered: start one with `tunefarm worker --device-key KEY`.");
  return h("div", { class: "table-wrap" }, h("table", { class: "grid", id: "workers-table" },
    h("thead", null, h("tr", null, ["worker", "state", "device key", "last seen", "per min", "measured", "failures", "infra failures", "host"]
      .map((t) => h("th", null, t)))),
    h("tbody", null, ws.map((w) => h("tr", { class: w.state === "quarantined" ? "warn" : "" },
      h("td", null, h("a", { href: `#/workers/${w.id}` }, w.name || w.id)),
      h("td", null, badge(w.state)),
      h("td", null, w.device_key),
      h("td", null, fmt.ago(w.last_seen_at)),
      h("td", { class: "num" }, w.throughput_per_min.toFixed(1)),
      h("td", { class: "num" }, w.measured),
      h("td", { class: "num" }, w.failures),
      h("td", { class: "num" }, w.infra_failures),
      h("td", null, w.hostname))))));
}

function detail(w) {
  const rows = [
    ["state", badge(w.state)], ["device key", w.device_key], ["target", fmt.target(w.target)],
    ["last seen", fmt.ago(w.last_seen_at)], ["registered", new Date(w.registered_at).toLocaleString()],
    ["throughput", `${w.throughput_per_min.toFixed(1)} measurements / min`],
    ["measured", String(w.measured)], ["kernel failures", String(w.failures)],
    ["infrastructure failures", String(w.infra_failures)], ["host", w.hostname], ["TVM", w.tvm_version],
  ];
  const note = w.state === "quarantined"
    ? h("p", { class: "error", role: "status" }, "Quarantined: its board failed repeatedly; it probes the board and takes work again once a probe passes.")
    : null;
  return [h("h1", null, `Worker ${w.name || w.id} `, badge(w.state)), note,
    h("dl", { id: "worker-detail" }, rows.map(([k, v]) => [h("dt", null, k), h("dd", null, v)])),
    h("h2", null, "Target"), h("pre", { class: "code" }, JSON.stringify(w.target, null, 2)),
    h("h2", null, "Capabilities"), h("pre", { class: "code" }, JSON.stringify(w.capabilities, null, 2))];
}

export function render(view, { id }) {
  const body = h("div");
  let timer = null;
  let gone = false;
  if (!id) view.append(h("h1", null, "Workers"));
  view.append(body);

  async function load() {
    try {
      const ws = await api("/v1/workers");
      if (gone) return;
      if (!id) fill(body, list(ws));
      else {
        const w = ws.find((x) => x.id === id);
        fill(body, w ? detail(w) : errorBox(new Error(`no worker ${id}`)));
      }
      timer = setTimeout(load, REFRESH_MS);
    } catch (err) {
      if (!gone) fill(body, errorBox(err));
    }
  }
  load();
  return () => { gone = true; clearTimeout(timer); };
}
