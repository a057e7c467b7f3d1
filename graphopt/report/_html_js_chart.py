"""The charts' part of the page's script: roofline points and timeline bars lead to the table.

``html.py`` draws each roofline's axes and ``partition_html`` the timeline; ``plot()`` adds one
point per node from the records the table shows (points on one pixel merge, per kernel class,
above ``D.merge``), ``dim()`` greys the points the table's filter hides, and a click on a point or
a timeline bar shows that node in the table. It is a fragment of the one closure that
``_html_js`` assembles: it reads ``R``, ``S``, ``per``, ``matches`` and ``focus`` from there.
"""

from __future__ import annotations

__all__ = ["CHART_SCRIPT"]

CHART_SCRIPT = r"""const PTS = [], NS = "http://www.w3.org/2000/svg";
const clamp = (v, lo, hi) => Math.max(lo, Math.min(hi, v));
function plot() {
  for (const svg of document.querySelectorAll("svg.roofline")) {
    const a = svg.dataset, t = Number(a.t), g = svg.querySelector("g.pts");
    const [x0, x1, y0, y1] = [a.lx0, a.lx1, a.ly0, a.ly1].map(Number);
    const [px, py, pw, ph] = [a.px, a.py, a.pw, a.ph].map(Number);
    const pts = [];
    for (const r of R) {
      const f = per(r, t, "flops"), ai = per(r, t, "ai"), s = per(r, t, "est_time_s");
      if (!(f > 0 && ai > 0 && s > 0)) continue;
      const x = clamp(px + (Math.log10(ai) - x0) / (x1 - x0) * pw, px, px + pw);
      const y = clamp(py + ph - (Math.log10(f / s) - y0) / (y1 - y0) * ph, py, py + ph);
      pts.push({r: r, x: x, y: y, att: f / s, ai: ai});
    }
    const merge = pts.length > D.merge, groups = new Map();
    for (const p of pts) {
      const key = merge ? [p.r.kernel_class, Math.round(p.x), Math.round(p.y)].join("|")
        : String(p.r.i);
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(p);
    }
    for (const ps of groups.values()) {
      const p = ps[0], c = document.createElementNS(NS, "circle");
      c.setAttribute("class", "pt");
      c.setAttribute("cx", p.x.toFixed(1));
      c.setAttribute("cy", p.y.toFixed(1));
      c.setAttribute("r", ps.length > 1 ? "4.5" : "3.5");
      c.setAttribute("fill", color(p.r.kernel_class));
      c.dataset.idx = String(p.r.i);
      c.dataset.n = String(ps.length);
      const tt = document.createElementNS(NS, "title");
      tt.textContent = (ps.length > 1 ? ps.length + " nodes, e.g. " : "") + p.r.name + "\n" +
        (p.r.kernel_class || "") + DOT + sig(p.ai) + " FLOP/B" + DOT + si(p.att, "FLOP/s") +
        DOT + sec(per(p.r, t, "est_time_s"));
      c.appendChild(tt);
      c.addEventListener("click", () => focus(p.r));
      g.appendChild(c);
      PTS.push([c, ps.map((q) => q.r)]);
    }
  }
}
function dim() {
  const on = S.filter || S.cls || S.bn;
  for (const [c, rs] of PTS) c.classList.toggle("dim", !!on && !rs.some(matches));
}
const BYNAME = new Map();
for (const r of R) if (!BYNAME.has(r.name)) BYNAME.set(r.name, r);
for (const b of document.querySelectorAll("svg.gantt [data-node]")) {
  b.addEventListener("click", () => {
    const r = BYNAME.get(b.getAttribute("data-node"));
    if (r) focus(r);
  });
}
"""
