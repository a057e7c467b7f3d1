"""The page's stylesheet (light and dark), inlined by html.py; no fonts or images are fetched."""

from __future__ import annotations

__all__ = ["STYLE"]

STYLE = """
:root{--bg:#f5f6f8;--panel:#fff;--fg:#1c2230;--muted:#5e6a7b;--faint:#8d97a5;--line:#e2e6eb;
--line2:#eef1f4;--accent:#2f64d0;--hover:#f2f6fd;--chip:#eef1f5;--yes:#e2f3e9;--yes-fg:#1b6a43;
--warn:#fff6e3;--warn-fg:#82560a;--bad:#fde8e8;--bad-fg:#a11d1d;--head:#131a29;--head-fg:#e9edf4;--head-muted:#9dadc4;
--mono:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono","Liberation Mono",monospace;
--sans:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,"Noto Sans",sans-serif}
@media (prefers-color-scheme:dark){:root{--bg:#0e1116;--panel:#161a21;--fg:#e4e8ee;
--muted:#9aa5b4;--faint:#6f7a89;--line:#262c36;--line2:#1e232b;--hover:#1c2330;--chip:#222833;
--yes:#17301f;--yes-fg:#7fd1a2;--bad:#3a1a1a;--bad-fg:#f19a9a;--warn:#2e2613;--warn-fg:#e8c277;--head:#0a0d12}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:13px/1.45 var(--sans)}
.top{background:var(--head);color:var(--head-fg);padding:18px 28px 16px}
.top .wrap{max-width:1680px;margin:0 auto;display:flex;gap:24px;justify-content:space-between;
align-items:flex-end;flex-wrap:wrap}
.brand{font-size:11px;letter-spacing:.09em;text-transform:uppercase;color:var(--head-muted)}
.top h1{margin:3px 0 3px;font-size:21px;font-weight:600;word-break:break-all}
.top .sub,.top .meta{color:var(--head-muted);font-size:12.5px}
.top .meta{text-align:right}
main{padding:18px 28px 40px;max-width:1680px;margin:0 auto}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:12px;
margin:0 0 16px}
.card,.panel{background:var(--panel);border:1px solid var(--line);border-radius:8px}
.card{padding:11px 14px;min-width:0;overflow-wrap:anywhere}
.card .k{font-size:11px;text-transform:uppercase;letter-spacing:.05em;color:var(--muted)}
.card .v{font-size:19px;font-weight:600;margin-top:2px;font-variant-numeric:tabular-nums}
.card .s{color:var(--muted);font-size:12px;margin-top:1px}
.card .v.sm{font-size:16px;line-height:21px;padding:4px 0 3px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:16px;
margin:0 0 16px}
.panel{padding:14px 16px;min-width:0}
.col{display:flex;flex-direction:column;gap:16px;min-width:0}
.panel h3{font-size:13px;margin:0 0 10px;font-weight:600}
.panel h3 .hint{font-weight:400;color:var(--faint);margin-left:6px}
h2{font-size:15px;margin:24px 0 10px;font-weight:600}
.stack{display:flex;height:14px;border-radius:4px;overflow:hidden;background:var(--line2);
margin:2px 0 8px}
.stack span{display:block;height:100%}
.keys{display:flex;flex-wrap:wrap;gap:4px 16px;color:var(--muted);margin-bottom:14px}
.keys b{color:var(--fg);font-weight:600}
.sw{display:inline-block;width:9px;height:9px;border-radius:2px;margin-right:6px;vertical-align:0}
.bars{display:grid;grid-template-columns:minmax(90px,max-content) 1fr auto auto;gap:4px 10px;
align-items:center}
.bars .lbl{font-family:var(--mono);font-size:12px;white-space:nowrap;overflow:hidden;
text-overflow:ellipsis;max-width:220px}
.bars .n{color:var(--faint);font-size:12px;text-align:right}
.bars .t{text-align:right;font-variant-numeric:tabular-nums}
.bar{height:9px;border-radius:3px;background:var(--line2);min-width:40px}
.bar span{display:block;height:100%;border-radius:3px;min-width:1px}
table{border-collapse:collapse;width:100%}
th,td{padding:5px 8px;text-align:left;border-bottom:1px solid var(--line2);vertical-align:top;
white-space:nowrap}
th{font-size:11.5px;font-weight:600;color:var(--muted);background:var(--panel)}
.num{text-align:right;font-variant-numeric:tabular-nums}
.mono{font-family:var(--mono);font-size:12px}
.tpcode{font-family:var(--mono);font-size:12px;white-space:pre;overflow-x:auto;margin:4px 0}
.faint{color:var(--faint)}
.jump{cursor:pointer}.jump:hover{color:var(--accent);text-decoration:underline}
.trunc{max-width:360px;overflow:hidden;text-overflow:ellipsis}
.panel td.trunc{max-width:none;white-space:normal;overflow-wrap:anywhere}
.panel th{white-space:normal}
#nodes{font-size:12.5px}
#nodes th,#nodes td{padding:5px 6px}
#nodes td.trunc{max-width:18vw}#nodes td.op{max-width:8vw}#nodes td.dims{max-width:10vw}
#nodes td.op,#nodes td.dims{overflow:hidden;text-overflow:ellipsis}
#nodes td.decs{white-space:normal;min-width:140px}
.sharebar{display:inline-block;width:36px;height:6px;background:var(--line2);border-radius:3px;
margin-left:6px;vertical-align:1px}
.sharebar span{display:block;height:100%;background:var(--accent);border-radius:3px}
.chip{display:inline-block;padding:0 7px;border-radius:9px;background:var(--chip);font-size:11.5px;
margin:1px 4px 1px 0;line-height:18px;white-space:nowrap}
.chip.yes{background:var(--yes);color:var(--yes-fg)}
.chip.no{color:var(--faint)}
.tag{display:inline-block;font-size:10.5px;padding:0 5px;border-radius:3px;margin-left:6px;
background:var(--chip);color:var(--muted);font-family:var(--sans)}
.tag.flag{background:var(--warn);color:var(--warn-fg)}
.bn{font-size:11.5px;font-weight:600}
.bn.compute{color:#2f64d0}.bn.memory{color:#d07a1f}.bn.latency{color:#7b8594}
ul.warn{margin:0;padding:0;list-style:none}
ul.warn li{background:var(--warn);color:var(--warn-fg);border-radius:5px;padding:6px 10px;
margin:0 0 6px;word-break:break-word}
.issues h4{font-size:11px;text-transform:uppercase;letter-spacing:.05em;color:var(--muted);
margin:12px 0 6px}
.issues h4:first-child{margin-top:0}
.ok{color:var(--faint)}
.cmp{width:auto;min-width:60%}.cmp th,.cmp td{padding:5px 14px}
.cmp td:first-child{color:var(--muted)}
.cmp td.best{font-weight:700;color:var(--yes-fg)}
.roof svg{width:100%;height:auto;display:block;font-family:var(--sans)}
.roof .gl{stroke:var(--line);stroke-width:1}
.roof .ax{stroke:var(--faint);stroke-width:1}
.roof text{fill:var(--muted);font-size:10.5px}
.roof .rl{stroke:#1c2230;stroke-width:1.6;fill:none}
.roof .rt{fill:var(--fg);font-size:10px;font-weight:600}
.roof .bwl{paint-order:stroke;stroke:var(--panel);stroke-width:3px;stroke-linejoin:round}
@media (prefers-color-scheme:dark){.roof .rl{stroke:#cfd6e0}}
.pt{stroke:rgba(0,0,0,.35);stroke-width:.6;fill-opacity:.85;cursor:pointer}
.pt:hover{stroke:var(--fg);stroke-width:1.6}
.pt.dim{opacity:.12}
.legend{display:flex;flex-wrap:wrap;gap:4px 6px;margin-top:8px}
.legend button{font:inherit;font-size:11.5px;border:1px solid var(--line);background:var(--panel);
color:var(--fg);border-radius:11px;padding:1px 9px;cursor:pointer}
.legend button:hover{background:var(--hover)}
.cap{color:var(--faint);font-size:11.5px;margin-top:8px}
.controls{display:flex;flex-wrap:wrap;gap:8px;align-items:center;margin:0 0 10px}
.controls input,.controls select,.pager button{font:inherit;color:var(--fg);background:var(--panel);
border:1px solid var(--line);border-radius:6px;padding:5px 9px}
.controls input{width:320px;max-width:100%}
.controls .count{color:var(--muted);margin-left:auto}
.tablewrap{overflow:auto;max-height:78vh;background:var(--panel);border:1px solid var(--line);
border-radius:8px}
#nodes thead th{position:sticky;top:0;z-index:1;cursor:pointer;user-select:none;
box-shadow:inset 0 -1px 0 var(--line)}
#nodes thead tr.grp th{cursor:default;text-align:center;color:var(--fg);font-size:12px}
#nodes thead tr+tr th{top:27px}
#nodes thead th.sorted{color:var(--accent)}
#nodes thead th.sorted.asc::after{content:" \\25B2";font-size:9px}
#nodes thead th.sorted.desc::after{content:" \\25BC";font-size:9px}
#nodes tbody tr.row{cursor:pointer}
#nodes tbody tr.row:hover{background:var(--hover)}
#nodes tbody tr.open{background:var(--hover)}
#nodes td.tg{border-left:1px solid var(--line)}
tr.detail td{background:var(--bg);white-space:normal;padding:10px 14px 14px}
tr.detail .dgrid{position:sticky;left:14px;max-width:calc(100vw - 110px)}
.dgrid{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:10px 24px}
.dgrid h5{margin:0 0 4px;font-size:11px;text-transform:uppercase;letter-spacing:.05em;
color:var(--muted)}
.dgrid dl{margin:0;display:grid;grid-template-columns:max-content 1fr;gap:1px 12px}
.dgrid dt{color:var(--muted)}.dgrid dd{margin:0;overflow-wrap:anywhere}
.dec{margin:0 0 6px}.dec .why{color:var(--muted);margin-top:1px}
.dec .ex{color:var(--faint);font-family:var(--mono);font-size:11.5px}
.pager{display:flex;gap:8px;justify-content:center;padding:12px}
.pager button{cursor:pointer}
.pager button[hidden]{display:none}
.chip.bad{background:var(--bad);color:var(--bad-fg)}
.panel h4{font-size:11px;text-transform:uppercase;letter-spacing:.05em;color:var(--muted);
margin:14px 0 6px}
dl.facts{margin:10px 0 0;display:grid;grid-template-columns:max-content 1fr;gap:3px 14px}
dl.facts dt{color:var(--muted)}dl.facts dd{margin:0;overflow-wrap:anywhere}
dl.facts dd .faint{font-size:12px}
td.wrap{white-space:normal;min-width:180px;overflow-wrap:break-word}
.split{display:flex;flex-wrap:wrap;gap:4px 28px}.split>div{flex:1 1 320px;min-width:0}
.split>div+div{flex:2 1 540px}.panel.quant{margin:0 0 16px}
.stack span.nz{min-width:3px}
span.y{color:var(--yes-fg);font-weight:600}span.n{color:var(--bad-fg);font-weight:600}
.mem-table td .sw{vertical-align:0}
ul.notes{margin:8px 0 0;padding-left:18px;color:var(--muted);font-size:12px}
p.why{margin:8px 0 0;color:var(--muted);font-size:12.5px}
table.alts tr.pick td{background:var(--yes);font-weight:600}
table.alts tr.faint td{color:var(--faint)}
table.rt td:first-child,table.notes-t td:first-child{color:var(--fg)}
table.rt td{white-space:normal}
table.numerics tr.bad-row td{background:var(--bad)}
.cmps{display:flex;flex-direction:column;gap:16px;margin:0 0 16px}
.cmps .panel{overflow-x:auto}
.cmp tr.grp td{font-size:11px;text-transform:uppercase;letter-spacing:.05em;color:var(--muted);
padding-top:12px;border-bottom:1px solid var(--line)}
.cmp.dep td:first-child{color:var(--fg)}
details.more{margin:0 0 16px}
details.more summary{cursor:pointer;color:var(--accent);margin:0 0 10px;font-weight:600}
.dgrid .wide{grid-column:1/-1}
.dec dl.ex{display:grid;grid-template-columns:max-content 1fr;gap:0 12px;margin:3px 0 0;
font-family:var(--mono);font-size:11.5px;color:var(--faint)}
.part{margin:0 0 16px}
.pgrid{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:4px 28px}
.pgrid>div{min-width:0}.scroll,.gwrap{overflow-x:auto}
.ptop{display:flex;flex-wrap:wrap;gap:4px 28px}.ptop>div:first-child{flex:1 1 360px}
.ptop>div:last-child{flex:0 1 auto;max-width:100%;margin-top:6px}
svg.gantt{width:100%;min-width:640px;height:auto;display:block;font-family:var(--sans)}
.gantt .lane{fill:var(--line2)}.gantt .lane.link{fill:var(--bg)}
.gantt .ll{fill:var(--fg);font:11px var(--mono)}.gantt .ll.link{fill:var(--muted);font-size:9px}
.gantt .gt{stroke:var(--line);stroke-width:1}
.gantt .ax{fill:var(--muted);font-size:10.5px}
.gantt [data-node]{cursor:pointer}
.gantt .gb:hover,.gantt .gx:hover,.gantt .gc:hover{stroke:var(--fg);stroke-width:1}
.gkeys{margin:8px 0 0}
.panel h4 .hint{text-transform:none;letter-spacing:0;font-weight:400;color:var(--faint);
margin-left:6px}
.gantt .gb,.gantt .gx,.gantt .gc{stroke:var(--panel);stroke-width:.6}.gantt .m{stroke:none}
.gantt .gx,.sw.cp{fill:var(--fg);background:var(--fg)}
footer{color:var(--faint);font-size:11.5px;text-align:center;padding:10px 0 24px}
"""
