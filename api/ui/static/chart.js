// A small canvas chart: points coloured by kind, a step line (best so far) and an optional
// dashed reference line (the board's peak). Thousands of points redraw in a few milliseconds;
// redraws are batched to one per animation frame, so a live stream of records stays cheap.

export const COLORS = {
  ok: "#2563eb", build_error: "#d97706", build_timeout: "#b45309", run_error: "#dc2626",
  run_timeout: "#7c3aed", wrong_answer: "#db2777", worker_lost: "#6b7280", line: "#059669",
  estimate: "#2563eb", peak: "#9ca3af",
};

function niceTicks(lo, hi, count, integer = false) {
  const span = hi - lo || 1;
  const raw = span / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => span / s <= count) || 10 * mag;
  if (integer) step = Math.max(1, step === 2.5 * mag ? 5 * mag : step);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
  return ticks;
}

function label(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e6 || a < 1e-4) return v.toExponential(1);
  return String(Number(v.toPrecision(4)));
}

export class Chart {
  // opts: {yLabel, xLabel, height, reference: {y, label}|null, describe(point) -> text,
  //        zero (false: the y axis spans the data only), step (false: a plain polyline),
  //        extendLine (false: the line ends at its last point)}
  constructor(host, opts = {}) {
    this.opts = { height: 280, xLabel: "trial", yLabel: "", ...opts };
    this.points = [];  // {x, y (null: failed), kind}
    this.line = [];  // {x, y}
    this.host = host;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "chart-canvas";
    this.tip = document.createElement("div");
    this.tip.className = "chart-tip";
    this.tip.hidden = true;
    host.classList.add("chart");
    host.append(this.canvas, this.tip);
    this.canvas.addEventListener("mousemove", (e) => this.hover(e));
    this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.resize = new ResizeObserver(() => this.schedule());
    this.resize.observe(host);
    this.pending = false;
  }

  setData(points, line) {
    this.points = points;
    this.line = line || [];
    this.schedule();
  }

  setReference(ref) {
    this.opts.reference = ref;
    this.schedule();
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  frame() {
    const w = Math.max(200, this.host.clientWidth);
    const h = this.opts.height;
    const pad = { l: 58, r: 12, t: 12, b: 34 };
    let x0 = Infinity;
    let x1 = -Infinity;
    let top = 0;
    let low = Infinity;
    for (const p of this.points) {  // loops, not Math.max(...): 100k arguments overflow
      x0 = Math.min(x0, p.x); x1 = Math.max(x1, p.x);
      if (p.y !== null) { top = Math.max(top, p.y); low = Math.min(low, p.y); }
    }
    for (const p of this.line) { x0 = Math.min(x0, p.x); x1 = Math.max(x1, p.x); top = Math.max(top, p.y); low = Math.min(low, p.y); }
    const ref = this.opts.reference;
    if (ref && ref.y) top = Math.max(top, ref.y);
    if (!isFinite(x0)) { x0 = 0; x1 = 1; }
    x1 = Math.max(x0 + 1, x1);
    let y0 = 0;
    let y1 = top * 1.08 || 1;
    if (this.opts.zero === false && isFinite(low)) {  // a narrow range: show the change
      const span = Math.max(top - low, top * 0.02);
      y0 = Math.max(0, low - span * 0.15);
      y1 = top + span * 0.15;
    }
    const sx = (x) => pad.l + ((x - x0) / (x1 - x0)) * (w - pad.l - pad.r);
    const sy = (y) => h - pad.b - ((y - y0) / (y1 - y0)) * (h - pad.t - pad.b);
    return { w, h, pad, x0, x1, y0, y1, sx, sy };
  }

  draw() {
    const f = this.frame();
    const dpr = window.devicePixelRatio || 1;
    this.canvas.width = Math.round(f.w * dpr);
    this.canvas.height = Math.round(f.h * dpr);
    this.canvas.style.width = `${f.w}px`;
    this.canvas.style.height = `${f.h}px`;
    const g = this.canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, f.w, f.h);
    g.font = "11px system-ui, sans-serif";
    g.strokeStyle = "#e5e7eb";
    g.fillStyle = "#6b7280";
    g.lineWidth = 1;
    g.textAlign = "right";
    g.textBaseline = "middle";
    for (const t of niceTicks(f.y0, f.y1, 5)) {
      const y = Math.round(f.sy(t)) + 0.5;
      g.beginPath(); g.moveTo(f.pad.l, y); g.lineTo(f.w - f.pad.r, y); g.stroke();
      g.fillText(label(t), f.pad.l - 6, y);
    }
    g.textAlign = "center";
    g.textBaseline = "top";
    for (const t of niceTicks(f.x0, f.x1, Math.max(2, Math.floor(f.w / 90)), true)) {
      g.fillText(label(t), f.sx(t), f.h - f.pad.b + 6);
    }
    g.fillText(this.opts.xLabel, (f.pad.l + f.w - f.pad.r) / 2, f.h - 13);
    g.save();
    g.translate(12, (f.pad.t + f.h - f.pad.b) / 2);
    g.rotate(-Math.PI / 2);
    g.fillText(this.opts.yLabel, 0, -6);
    g.restore();
    const ref = this.opts.reference;
    if (ref && ref.y) {
      const y = f.sy(ref.y);
      g.strokeStyle = COLORS.peak;
      g.setLineDash([5, 4]);
      g.beginPath(); g.moveTo(f.pad.l, y); g.lineTo(f.w - f.pad.r, y); g.stroke();
      g.setLineDash([]);
      g.textAlign = "right";
      g.textBaseline = "bottom";
      g.fillText(ref.label, f.w - f.pad.r, y - 2);
    }
    for (const p of this.points) {  // failures sit on the axis as crosses
      g.fillStyle = g.strokeStyle = COLORS[p.kind] || "#0891b2";
      const x = f.sx(p.x);
      if (p.y === null) {
        const y = f.h - f.pad.b - 4;
        g.beginPath(); g.moveTo(x - 3, y - 3); g.lineTo(x + 3, y + 3);
        g.moveTo(x - 3, y + 3); g.lineTo(x + 3, y - 3); g.stroke();
      } else {
        g.fillRect(x - 2, f.sy(p.y) - 2, 4, 4);
      }
    }
    if (this.line.length) {
      g.strokeStyle = COLORS.line;
      g.lineWidth = 2;
      g.beginPath();
      this.line.forEach((p, i) => {
        const x = f.sx(p.x);
        const y = f.sy(p.y);
        if (i === 0) g.moveTo(x, y);
        else if (this.opts.step === false) g.lineTo(x, y);
        else { g.lineTo(x, f.sy(this.line[i - 1].y)); g.lineTo(x, y); }
      });
      if (this.opts.extendLine !== false) g.lineTo(f.sx(f.x1), f.sy(this.line[this.line.length - 1].y));
      g.stroke();
    }
    this.canvas.dataset.points = String(this.points.length);
    this.last = f;
  }

  hover(e) {
    const f = this.last;
    if (!f || !this.points.length) return;
    const r = this.canvas.getBoundingClientRect();
    const mx = e.clientX - r.left;
    let best = null;
    let dist = Infinity;
    for (const p of this.points) {
      const d = Math.abs(f.sx(p.x) - mx);
      if (d < dist) { dist = d; best = p; }
    }
    if (!best || dist > 12) { this.tip.hidden = true; return; }
    this.tip.textContent = this.opts.describe ? this.opts.describe(best) : `${best.x}: ${best.y}`;
    this.tip.hidden = false;
    const left = Math.min(f.w - 180, Math.max(0, f.sx(best.x) + 8));
    this.tip.style.left = `${left}px`;
    this.tip.style.top = `${best.y === null ? f.h - f.pad.b - 40 : Math.max(0, f.sy(best.y) - 30)}px`;
  }
}
