"""The page's script: builds the node table from the embedded JSON, then starts the page.

The JSON holds interned tables (``_html_data``); ``decode()`` expands them into one record per
node first, so everything after it reads plain records.

It reads the node data only from the ``application/json`` block and builds every element with
``textContent``/``setAttribute``: data never reaches ``innerHTML``. View state lives in the URL
hash (``#sort=est_time_s&desc=1&filter=mm&class=gemm&bottleneck=memory&open=3&n=400``).

``SCRIPT`` is one closure: the table's code, the charts' code (``_html_js_chart``), then the
start-up lines, which must come last because the charts' ``const`` points list has to exist
before the first ``update()`` dims it.
"""

from __future__ import annotations

from graphopt.report._html_js_chart import CHART_SCRIPT

__all__ = ["SCRIPT"]

_TABLE = r"""(() => {
"use strict";
const D = JSON.parse(document.getElementById("graphopt-data").textContent);
const NT = D.targets.length, PAGE = D.page, TI = {};
D.tfields.forEach((f, i) => { TI[f] = i; });
// The tables hold each distinct value once (graphopt/report/_html_data.py); expand them into one
// record per node. Nodes share the decoded strings, tensors and decisions.
function decode() {
  const str = (i) => (i === null ? null : D.strings[i]);
  const pairs = (ps) => ps.map((p) => [str(p[0]), str(p[1])]);
  const tensors = D.tensors.map((t) => t.map(str));
  const decs = D.decisions.map((d) => [str(d[0]), str(d[1]), str(d[2]), pairs(d[3]), d[4], d[5]]);
  const dsets = D.dsets.map((d) => [str(d[0]), d[1].map((k) => decs[k])]);
  const costs = D.costs.map(pairs);
  const TEXT = ["op", "op_type", "kernel_class", "dims", "dtype", "pattern"];
  const profiles = D.profiles.map((a) => {
    const p = {};
    D.profile.forEach((f, j) => { p[f] = TEXT.includes(f) ? str(a[j]) : a[j]; });
    p.flags = p.flags.map(str);
    return p;
  });
  const target = (q, p, d, g) => {
    if (q === null || d === null) return null;
    const own = q.length > 6, ds = dsets[d];
    const t = {est_time_s: q[0], bottleneck: str(q[1]), compute_time_s: q[2],
               memory_time_s: q[3], peak_flops_used: q[4], flops: own ? q[6] : p.flops,
               ai: own ? q[7] : p.ai, decisions: ds[1], cost: costs[q[5]], dhead: ds[0],
               fusion_group: str(g)};
    return D.tfields.map((f) => t[f]);
  };
  return D.nodes.map((a, i) => {
    const p = profiles[a[1]], r = Object.assign({i: i, name: str(a[0])}, p);
    r.inputs = a[2].map((k) => tensors[k]);
    r.outputs = a[3].map((k) => tensors[k]);
    r.per = p.per.map((q, t) => target(q, p, a[4][t], a[5][t]));
    r.hay = [r.name, r.op, r.op_type, r.kernel_class].join("\u0000").toLowerCase();
    return r;
  });
}
const R = decode();
const BN = ["compute", "memory", "latency"], DASH = "\u2014", DOT = " \u00b7 ";
const $ = (id) => document.getElementById(id);
const fin = (v) => typeof v === "number" && isFinite(v);
const sig = (v) => String(Number(v.toPrecision(3)));
function si(v, u) {
  if (!fin(v)) return DASH;
  const P = [[1e18, "E"], [1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [s, p] of P) if (Math.abs(v) >= s) return (sig(v / s) + " " + p + u).trim();
  return (sig(v) + " " + u).trim();
}
function sec(v) {
  if (!fin(v)) return DASH;
  for (const [s, u] of [[1, "s"], [1e-3, "ms"], [1e-6, "\u00b5s"]])
    if (Math.abs(v) >= s) return sig(v / s) + " " + u;
  return sig(v * 1e9) + " ns";
}
function bytes(v) {
  if (!fin(v)) return DASH;
  const P = [[2 ** 40, "TiB"], [2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"]];
  for (const [s, u] of P) if (Math.abs(v) >= s) return sig(v / s) + " " + u;
  return Math.trunc(v) + " B";
}
const cnt = (v) => fin(v) ? Math.trunc(v).toLocaleString("en-US") : DASH;
const pct = (v) => fin(v) ? (100 * v).toFixed(1) + "%" : DASH;
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
const per = (r, t, f) => (r.per[t] ? r.per[t][TI[f]] : null);
const color = (k) => (Object.hasOwn(D.colors, k) ? D.colors[k] : "#8d97a5");
const chipCls = (d) => (d[4] === 1 ? "chip yes" : d[4] === 0 ? "chip no" : "chip");

function nameCell(r) {
  const td = el("td", "mono trunc", r.name);
  td.title = r.name;
  if (r.pattern) td.appendChild(el("span", "tag", r.pattern));
  for (const f of r.flags || []) td.appendChild(el("span", "tag flag", f));
  return td;
}
function opCell(r) {
  const td = el("td", "mono op", r.op_type || r.op);
  td.title = r.op;  // as the model spells it, e.g. aten.linear.default
  return td;
}
function classCell(r) {
  const td = el("td"), sw = el("span", "sw");
  sw.style.background = color(r.kernel_class);
  td.appendChild(sw);
  td.appendChild(document.createTextNode(r.kernel_class || DASH));
  return td;
}
function bnCell(r, t) {
  const b = per(r, t, "bottleneck"), td = el("td");
  td.appendChild(el("span", BN.includes(b) ? "bn " + b : "bn", b || DASH));
  return td;
}
function decCell(r, t) {
  // precision, exec path and device as one chip ("bf16 \u00b7 tma_wgmma \u00b7 cuda:0"),
  // the other decisions after it
  const td = el("td", "decs"), ds = per(r, t, "decisions") || [];
  const dev = ds.find((d) => d[0] === "device"), hs = ds.filter((d) => d[5] || d === dev);
  const head = [per(r, t, "dhead"), dev ? dev[1] : ""].filter((x) => x).join(DOT);
  if (head) {
    const c = el("span", hs.length && hs[0][4] === 1 ? "chip yes" : "chip", head);
    c.title = hs.map((d) => d[0] + ": " + (d[2] || "")).join("\n");
    td.appendChild(c);
  }
  for (const d of ds) {
    if (d[5] || d === dev) continue;
    const c = el("span", chipCls(d), d[0] + ": " + d[1]);
    c.title = d[2] || "";
    td.appendChild(c);
  }
  return td;
}
function shareCell(r, t) {
  const lat = D.targets[t].lat, v = per(r, t, "est_time_s");
  const s = fin(v) && lat ? v / lat : null;
  const td = el("td", "num", pct(s)), b = el("span", "sharebar"), f = el("span");
  f.style.width = (fin(s) ? Math.min(100, 100 * s) : 0).toFixed(1) + "%";
  b.appendChild(f);
  td.appendChild(b);
  return td;
}
const aiText = (v) => (fin(v) ? sig(v) : DASH);
const COLS = [
  {k: "idx", l: "#", num: 1, v: (r) => r.i, f: (r) => String(r.i), c: "num faint"},
  {k: "name", l: "Node", v: (r) => r.name, cell: nameCell},
  {k: "op", l: "Op", v: (r) => r.op_type || r.op, cell: opCell},
  {k: "kernel_class", l: "Kernel class", v: (r) => r.kernel_class, cell: classCell},
  {k: "dims", l: "Dims", v: (r) => r.dims, f: (r) => r.dims, c: "mono faint dims"},
  {k: "dtype", l: "Dtype", v: (r) => r.dtype, f: (r) => r.dtype || DASH, c: "mono"},
  {k: "flops", l: "FLOPs", num: 1, v: (r) => r.flops, f: (r) => si(r.flops, ""), c: "num"},
  {k: "bytes", l: "Bytes", num: 1, v: (r) => r.bytes, f: (r) => bytes(r.bytes), c: "num"},
  {k: "ai", l: "FLOP/B", num: 1, v: (r) => r.ai, f: (r) => aiText(r.ai), c: "num"},
].filter((c) => NT === 1 || c.k !== "dims");  // several targets: room for their columns
const NCOMMON = COLS.length;
for (let t = 0; t < NT; t++) {
  const x = t ? "." + t : "", est = (r) => per(r, t, "est_time_s");
  COLS.push({k: "est_time_s" + x, l: "Est. time", num: 1, t: t, v: est,
             f: (r) => sec(est(r)), c: "num tg", g: 1});
  if (NT === 1) COLS.push({k: "share", l: "Share", num: 1, t: t, v: est,
                           cell: (r) => shareCell(r, t)});
  COLS.push({k: "bottleneck" + x, l: "Bottleneck", t: t, v: (r) => per(r, t, "bottleneck"),
             cell: (r) => bnCell(r, t)});
  // the kernel each node runs in; only where the plan has fusion groups (older reports lack them)
  if (R.some((r) => per(r, t, "fusion_group"))) {
    COLS.push({k: "fusion_group" + x, l: "Fusion group", t: t,
               v: (r) => per(r, t, "fusion_group"), f: (r) => per(r, t, "fusion_group") || DASH,
               c: "mono"});
  }
  COLS.push({k: "decisions" + x, l: "Decisions", t: t, nosort: 1, cell: (r) => decCell(r, t)});
}
const DEF = {sort: "est_time_s", desc: true, filter: "", cls: "", bn: "", open: [], n: PAGE};
let S = Object.assign({}, DEF), view = [];

function readHash() {
  const h = new URLSearchParams(location.hash.replace(/^#/, ""));
  const s = Object.assign({}, DEF, {open: []});
  const sort = h.get("sort");
  if (COLS.some((c) => c.k === sort && !c.nosort)) s.sort = sort;
  if (h.has("desc")) s.desc = h.get("desc") === "1";
  else if (h.has("sort")) s.desc = false;
  s.filter = h.get("filter") || "";
  s.cls = h.get("class") || "";
  s.bn = h.get("bottleneck") || "";
  s.open = (h.get("open") || "").split(",").filter((x) => /^\d+$/.test(x)).map(Number)
    .filter((i) => i < R.length);
  const n = parseInt(h.get("n") || "", 10);
  if (n > 0) s.n = n;
  return s;
}
function writeHash() {
  const h = new URLSearchParams();
  if (S.sort !== DEF.sort || S.desc !== DEF.desc) {
    h.set("sort", S.sort);
    h.set("desc", S.desc ? "1" : "0");
  }
  if (S.filter) h.set("filter", S.filter);
  if (S.cls) h.set("class", S.cls);
  if (S.bn) h.set("bottleneck", S.bn);
  if (S.open.length) h.set("open", S.open.join(","));
  if (S.n !== PAGE) h.set("n", String(S.n));
  const q = h.toString();
  try {
    history.replaceState(null, "", q ? "#" + q : location.pathname + location.search);
  } catch (e) { /* some browsers refuse on file: URLs; the view itself still works */ }
}
function matches(r) {
  if (S.cls && r.kernel_class !== S.cls) return false;
  if (S.bn && per(r, 0, "bottleneck") !== S.bn) return false;
  return !S.filter || r.hay.includes(S.filter.toLowerCase());
}
const none = (x) => x === null || x === undefined;
function compute() {
  const col = COLS.find((c) => c.k === S.sort) || COLS[0], dir = S.desc ? -1 : 1;
  view = R.filter(matches);
  view.sort((a, b) => {
    const x = col.v(a), y = col.v(b), nx = none(x), ny = none(y);
    if (nx || ny) return nx === ny ? a.i - b.i : nx ? 1 : -1;
    if (x < y) return -dir;
    if (x > y) return dir;
    return a.i - b.i;
  });
}
function header() {
  const th = $("nodes").tHead;
  th.textContent = "";
  if (NT > 1) {
    const g = el("tr", "grp"), lead = el("th");
    lead.colSpan = NCOMMON;
    g.appendChild(lead);
    for (const t of D.targets) {
      const c = el("th", "tg", t.display);
      c.colSpan = 3;
      g.appendChild(c);
    }
    th.appendChild(g);
  }
  const tr = el("tr");
  for (const c of COLS) {
    const h = el("th", (c.num ? "num " : "") + (c.g ? "tg" : ""), c.l);
    h.dataset.k = c.k;
    if (c.k === S.sort) h.classList.add("sorted", S.desc ? "desc" : "asc");
    if (!c.nosort) h.addEventListener("click", () => {
      if (S.sort === c.k) S.desc = !S.desc;
      else { S.sort = c.k; S.desc = !!c.num; }
      update();
    });
    tr.appendChild(h);
  }
  th.appendChild(tr);
}
function dl(pairs) {
  const d = el("dl");
  for (const [k, v] of pairs) {
    d.appendChild(el("dt", "", k));
    d.appendChild(el("dd", "", v));
  }
  return d;
}
function block(title, child) {
  const b = el("div");
  b.appendChild(el("h5", "", title));
  b.appendChild(child);
  return b;
}
function decisions(r, k) {
  const ds = el("div");
  for (const d of per(r, k, "decisions") || []) {
    const b = el("div", "dec"), head = el("div");
    head.appendChild(el("span", chipCls(d), d[0] + ": " + d[1]));
    b.appendChild(head);
    b.appendChild(el("div", "why", d[2] || "(no reason given)"));
    if (d[3].length) {
      const x = dl(d[3]);
      x.className = "ex";
      b.appendChild(x);
    }
    ds.appendChild(b);
  }
  if (!ds.childNodes.length) ds.appendChild(el("div", "faint", "no decisions"));
  return ds;
}
function detail(r) {
  const tr = el("tr", "detail"), td = el("td"), g = el("div", "dgrid");
  td.colSpan = COLS.length;
  const io = (xs) => (xs.length ? xs.map((x) => [x[0], x[1] + " " + (x[2] || "?")]) : [[DASH, ""]]);
  g.appendChild(block("Inputs", dl(io(r.inputs))));
  g.appendChild(block("Outputs", dl(io(r.outputs))));
  g.appendChild(block("Work", dl([
    ["op (canonical)", r.op + " (" + r.op_type + ")"], ["dims", r.dims || DASH],
    ["dtype", r.dtype || DASH], ["FLOPs", si(r.flops, "FLOP")],
    ["bytes read", bytes(r.bytes_read)], ["bytes written", bytes(r.bytes_written)],
    ["FLOP/byte", aiText(r.ai)], ["params", cnt(r.params)]])));
  D.targets.forEach((t, k) => {
    if (!r.per[k]) return;
    const sfx = NT > 1 ? DOT + t.display : "";
    g.appendChild(block("Cost" + sfx, dl([
      ["est. time", sec(per(r, k, "est_time_s"))],
      ["compute time", sec(per(r, k, "compute_time_s"))],
      ["memory time", sec(per(r, k, "memory_time_s"))],
      ["peak used", si(per(r, k, "peak_flops_used"), "FLOP/s")],
      ["bottleneck", per(r, k, "bottleneck") || DASH],
      ["fusion group", per(r, k, "fusion_group") || DASH]].concat(per(r, k, "cost") || []))));
    const dec = block("Decisions" + sfx, decisions(r, k));
    dec.className = "wide";
    g.appendChild(dec);
  });
  td.appendChild(g);
  tr.appendChild(td);
  return tr;
}
function body() {
  const tb = $("nodes").tBodies[0], open = new Set(S.open);
  const frag = document.createDocumentFragment();
  tb.textContent = "";
  for (const r of view.slice(0, S.n)) {
    const tr = el("tr", "row");
    tr.dataset.idx = String(r.i);
    for (const c of COLS) {
      const td = c.cell ? c.cell(r) : el("td", c.c || "", c.f(r));
      if (!c.cell && !c.num) td.title = td.textContent;
      tr.appendChild(td);
    }
    tr.addEventListener("click", () => {
      S.open = open.has(r.i) ? S.open.filter((i) => i !== r.i) : S.open.concat([r.i]);
      update(true);
    });
    frag.appendChild(tr);
    if (open.has(r.i)) {
      tr.classList.add("open");
      frag.appendChild(detail(r));
    }
  }
  tb.appendChild(frag);
  const shown = Math.min(S.n, view.length), rest = view.length - shown;
  $("count").textContent = "Showing " + cnt(shown) + " of " + cnt(view.length) +
    " matching nodes (" + cnt(R.length) + " total)";
  $("more").hidden = rest <= 0;
  $("more").textContent = "Show " + cnt(Math.min(PAGE, rest)) + " more";
  $("all").hidden = rest <= 0 || view.length > D.maxall;
  $("all").textContent = "Show all " + cnt(view.length);
}
function focus(r) {
  S.filter = r.name; S.cls = ""; S.bn = ""; S.open = [r.i]; S.n = PAGE;
  controls();
  update();
  $("nodes-title").scrollIntoView({block: "start"});
}
function controls() {
  $("q").value = S.filter;
  $("kc").value = S.cls;
  $("bsel").value = S.bn;
  if ($("kc").value !== S.cls) S.cls = $("kc").value = "";
  if ($("bsel").value !== S.bn) S.bn = $("bsel").value = "";
}
function update(keepRows) {
  if (!keepRows) compute();
  header();
  body();
  dim();
  writeHash();
}
let timer = 0;
$("q").addEventListener("input", () => {
  clearTimeout(timer);
  timer = setTimeout(() => { S.filter = $("q").value; S.n = PAGE; update(); }, 120);
});
$("kc").addEventListener("change", () => { S.cls = $("kc").value; S.n = PAGE; update(); });
$("bsel").addEventListener("change", () => { S.bn = $("bsel").value; S.n = PAGE; update(); });
$("more").addEventListener("click", () => { S.n += PAGE; update(true); });
$("all").addEventListener("click", () => { S.n = view.length; update(true); });
for (const b of document.querySelectorAll("button[data-class]")) {
  b.addEventListener("click", () => {
    S.cls = b.getAttribute("data-class"); S.filter = ""; S.n = PAGE;
    controls();
    update();
    $("nodes-title").scrollIntoView({block: "start"});
  });
}
for (const b of document.querySelectorAll(".jump[data-idx]")) {
  b.addEventListener("click", () => focus(R[Number(b.dataset.idx)]));
}
"""

_START = r"""window.addEventListener("hashchange", () => { S = readHash(); controls(); update(); });
S = readHash();
controls();
plot();
update();
document.body.dataset.ready = "1";
})();
"""

SCRIPT = _TABLE + CHART_SCRIPT + _START
