// DOM helpers. Text from the API always goes in as text nodes (never innerHTML): workload
// descriptions, error messages and worker names are other people's input.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

// Replace el's children, taking what h() takes (nested arrays; null and false are skipped).
export function fill(el, ...children) {
  clear(el);
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const fmt = {
  seconds(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1e-3) return `${(s * 1e6).toFixed(1)} µs`;
    if (s < 1) return `${(s * 1e3).toFixed(2)} ms`;
    return `${s.toFixed(2)} s`;
  },
  gflops(g) {
    return g === null || g === undefined ? "–" : g.toFixed(g >= 100 ? 0 : 1);
  },
  pct(x) {
    return x === null || x === undefined || !isFinite(x) ? "" : `${(100 * x).toFixed(0)}%`;
  },
  ago(iso) {
    if (!iso) return "–";
    const s = (Date.now() - Date.parse(iso)) / 1000;
    if (!isFinite(s)) return iso;
    if (s < 60) return `${Math.max(0, Math.round(s))} s ago`;
    if (s < 3600) return `${Math.round(s / 60)} min ago`;
    if (s < 86400) return `${Math.round(s / 3600)} h ago`;
    return new Date(iso).toLocaleString();
  },
  time(iso) {
    return iso ? new Date(iso).toLocaleTimeString() : "–";
  },
  workload(spec) {
    if (!spec) return "?";
    const shape = spec.shape ? ` ${spec.shape.join("×")}` : "";
    return `${spec.op}${shape}`;
  },
  // what a workload spec says besides its op and shape (dtype, layout, stride, padding...)
  params(spec) {
    return Object.entries(spec || {})
      .filter(([k, v]) => !["op", "shape"].includes(k) && v !== null && typeof v !== "object" && String(v).length < 40)
      .map(([k, v]) => `${k}=${v}`).join(" ");
  },
  target(t) {
    if (!t) return "?";
    const parts = [t.kind || "?"];
    if (t.mcpu) parts.push(t.mcpu);
    if (t["num-cores"]) parts.push(`${t["num-cores"]} cores`);
    return parts.join(" ");
  },
};

export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

export function badge(state) {
  return h("span", { class: `badge s-${String(state).toLowerCase()}` }, state);
}

export function progress(done, total) {
  const frac = total > 0 ? Math.min(1, done / total) : 0;
  const fill = h("span", { class: "fill" });
  fill.style.width = `${(100 * frac).toFixed(1)}%`;  // CSSOM: the CSP refuses style attributes
  return h("span", { class: "progress", title: `${done} of ${total}` },
    h("span", { class: "bar" }, fill), h("span", { class: "num" }, `${done} / ${total}`));
}

export function problemText(err) {
  if (err && err.problem && err.problem.detail) return `${err.problem.title || err.status}: ${err.problem.detail}`;
  return String(err && err.message ? err.message : err);
}

export function errorBox(err) {
  return h("div", { class: "error", role: "alert" }, problemText(err));
}

// A table whose columns sort on click. columns: [{label, value(row), render?(row), num?, desc?}]
// (desc: the first click sorts that column largest first, e.g. GFLOPS).
// Only the first `limit` rows of the current order are drawn (a job may have 10,000 records).
export function sortableTable(columns, rows, { sortBy = 0, desc = false, limit = 500, caption } = {}) {
  const wrap = h("div", { class: "table-wrap" });
  let key = sortBy;
  let down = desc;
  function draw() {
    const col = columns[key];
    const sorted = rows.slice().sort((a, b) => {
      const x = col.value(a);
      const y = col.value(b);
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;  // missing values last either way
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * (down ? -1 : 1);
    });
    const shown = sorted.slice(0, limit);
    const head = h("tr", null, columns.map((c, i) => h("th", {
      class: `${c.num ? "num" : ""} ${c.cls || ""} sortable`, "aria-sort": i === key ? (down ? "descending" : "ascending") : "none",
      onclick: () => { if (key === i) down = !down; else { key = i; down = !!c.desc; } draw(); },
    }, c.label, i === key ? (down ? " ▾" : " ▴") : "")));
    const body = document.createDocumentFragment();
    for (const r of shown) {
      body.append(h("tr", null, columns.map((c) => h("td", { class: `${c.num ? "num" : ""} ${c.cls || ""}` },
        c.render ? c.render(r) : c.value(r)))));
    }
    const note = rows.length > shown.length
      ? h("p", { class: "muted" }, `${shown.length} of ${rows.length} shown, in this order`) : null;
    clear(wrap).append(h("table", { class: "grid" }, caption ? h("caption", null, caption) : null,
      h("thead", null, head), h("tbody", null, body)), note || "");
  }
  draw();
  wrap.update = (newRows) => { rows = newRows; draw(); };
  return wrap;
}
