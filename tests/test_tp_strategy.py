"""Strategies beside HEFT and pipeline (issue 13, items 2 and 3): ``tensor`` over every device,
the 2-D split (tensor parallel per NVLink group, pipeline stages across groups) against a hand
check of its clock, ``auto``'s pick and the losers' numbers, the memory errors, ``--devices``
for several machines, the CLI and the report sections (split table, collective bars)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from graphopt.api.planning import with_partition
from graphopt.cli.main import main
from graphopt.decisions.planner import build_plan
from graphopt.errors import GraphoptError
from graphopt.frontends import load_graph
from graphopt.hardware import get_target
from graphopt.ir.plan_parallel import ParallelizeUnavailable
from graphopt.ir.plan_partition import Strategy, StrategyChoice
from graphopt.partition import parse_devices
from graphopt.partition.strategies import compare, run_strategy
from graphopt.partition.two_d import nvlink_groups, two_d
from graphopt.report.html import render_html
from graphopt.report.markdown import render_markdown
from tests.arch_zoo import build
from tests.report_plans import typed

ROOT = Path(__file__).resolve().parents[1]
TWO = "cuda:0=h100,cuda:1=h100"
NODES = "cuda:0=h100@a,cuda:1=h100@a,cuda:2=h100@b,cuda:3=h100@b,net=400Gb/s"


@pytest.fixture(scope="module")
def llama():
    model, inputs = build("llama")  # 1 layer, 4 heads, 2 KV heads
    graph = load_graph(model, inputs)
    return build_plan(graph, get_target("h100")), graph


# --- --devices for several machines ------------------------------------------------------

def test_devices_on_two_machines_talk_over_the_network():
    ds = parse_devices(NODES)
    assert ds.link("cuda:0", "cuda:1").name == "nvlink4"
    net = ds.link("cuda:1", "cuda:2")
    assert net.name == "net-400Gb/s" and net.bandwidth_bytes_per_s == 50e9
    assert parse_devices("cuda:0=h100@a,cuda:1=h100@b,net=50GB/s").link(
        "cuda:0", "cuda:1").bandwidth_bytes_per_s == 50e9
    assert nvlink_groups(ds) == [("cuda:0", "cuda:1"), ("cuda:2", "cuda:3")]
    assert nvlink_groups(parse_devices(TWO)) == [("cuda:0", "cuda:1")]
    assert nvlink_groups(parse_devices("cuda:0=h100,cpu")) == [("cuda:0",), ("cpu",)]


@pytest.mark.parametrize(("spec", "needle"), [
    ("cuda:0=h100@a,cuda:1=h100@b", "no network"),
    ("cuda:0=h100@a,cuda:1=h100@b,net=400", "not a positive bandwidth"),
    ("cuda:0=h100@a,net=1Gb/s,net=2Gb/s", "net= given twice"),
    ("cuda:0=h100@,cuda:1=h100", "empty name or machine"),
])
def test_bad_machine_specs_are_refused(spec, needle):
    with pytest.raises(GraphoptError, match=needle) as e:
        parse_devices(spec)
    assert e.value.fix


# --- tensor --------------------------------------------------------------------------------

def test_tensor_strategy_attaches_sections_and_group_decisions(llama):
    plan, graph = llama
    out = with_partition(plan, TWO, "tensor", source=graph)
    tp, st, part = out.tensor_parallel, out.strategy, out.partition
    assert st.winner == "tensor" and tp.degree == 2 and len(tp.splits) == 2
    assert part.strategy == "tensor" and part.makespan_s == tp.makespan_s
    assert len(part.collectives) == 2  # one all-reduce per row GEMM
    assert all(c.devices == ("cuda:0", "cuda:1") for c in part.collectives)
    pm = tp.parallelize_module
    assert pm.plan["model.layers.0.self_attn.o_proj"] == "RowwiseParallel"
    assert "parallelize_module(model, mesh, {" in pm.code
    shares = {n.decisions["device"].detail.share for n in out.nodes}
    assert shares == {"1/2", "replicated"}
    d = out.nodes[0].decisions["device"].detail
    assert d.devices == ("cuda:0", "cuda:1") and d.device == "cuda:0,cuda:1"


def test_tensor_strategy_memory_overflow_names_the_device(llama):
    plan, graph = llama
    with pytest.raises(GraphoptError, match=r"cuda:0 needs .* usable: .* over") as e:
        with_partition(plan, "cuda:0=h100:10MB,cuda:1=h100", "tensor", source=graph)
    assert "cuda:1" not in e.value.problem and "memory caps" in e.value.fix


def test_tensor_strategy_refuses_a_degree_nothing_divides(llama):
    plan, _ = llama  # 4 heads, 2 KV heads, intermediate 128: nothing splits 3 ways
    with pytest.raises(GraphoptError, match="splits no block") as e:
        with_partition(plan, "cuda:0=h100,cuda:1=h100,cuda:2=h100", "tensor")
    assert "do not divide" in e.value.problem and "--strategy heft" in e.value.fix


# --- 2-D -----------------------------------------------------------------------------------

def test_two_d_clock_by_hand(llama):
    plan, graph = llama
    ds = parse_devices(NODES)
    res = two_d(plan, ds, source=graph)
    assert [s.group for s in res.stages] == [("cuda:0", "cuda:1"), ("cuda:2", "cuda:3")]
    first, second = res.stages
    assert first.first == 0 and first.end == second.first and second.end == len(plan.nodes)
    # every block stays whole in its stage, split 2 ways
    assert sum(len(s.tp.splits) for s in res.stages) == 2
    assert all(b.degree == 2 for s in res.stages for b in s.tp.splits)
    # the cut crosses the 400 Gb/s network, not NVLink
    net = ds.link("cuda:1", "cuda:2")
    assert first.send_bytes > 0
    assert first.send_s == pytest.approx(net.latency_s + first.send_bytes / 50e9, rel=1e-12)
    assert second.send_s == 0.0
    assert {(t.src_device, t.dst_device) for t in res.transfers} == {
        ("cuda:0", "cuda:2"), ("cuda:1", "cuda:3")}
    latency = first.tp.makespan_s + first.send_s + second.tp.makespan_s
    assert res.latency_s == pytest.approx(latency, rel=1e-12)
    assert res.throughput_per_s == pytest.approx(
        1 / max(first.tp.makespan_s + first.send_s, second.tp.makespan_s), rel=1e-12)
    # the schedule is on the request's clock: stage 2 starts after stage 1 and the transfer
    starts = [s.start_s for s in res.schedule if s.device == "cuda:2"]
    assert min(starts) == pytest.approx(first.tp.makespan_s + first.send_s, rel=1e-12)
    d = res.to_record(ParallelizeUnavailable("not asked", None))
    assert [s.stage_s for s in d.stages] == [first.stage_s, second.stage_s]
    assert len(d.collectives) == 2 and {c.stage for c in d.collectives} <= {0, 1}


def test_two_d_cut_is_the_min_max_over_block_boundaries(llama):
    """The DP's cut against every allowed cut, on the same per-node times and transfers."""
    import numpy as np

    from graphopt.partition.pipeline_dp import cut_bytes
    from graphopt.partition.problem import build_problem
    from graphopt.partition.tensor_parallel import tensor_parallel
    from graphopt.partition.tp_blocks import find_tp_blocks
    from graphopt.partition.two_d import _cut_points, _node_times, sub_devices

    plan, graph = llama
    ds = parse_devices(NODES)
    pb = build_problem(plan, ds)
    times = [np.concatenate([[0.0], np.cumsum(_node_times(
        tensor_parallel(plan, sub_devices(ds, g), source=graph), pb.names))])
        for g in nvlink_groups(ds)]
    cut, net, n = cut_bytes(pb), ds.link("cuda:0", "cuda:2"), pb.n
    cuts = _cut_points(plan, find_tp_blocks(plan)[0])
    blocks = find_tp_blocks(plan)[0]
    pos = {x.name: i for i, x in enumerate(plan.nodes)}
    for b in blocks:  # no allowed cut falls inside a block
        lo, hi = min(pos[x] for x in b.nodes), max(pos[x] for x in b.nodes)
        assert not any(lo < j <= hi for j in cuts)

    def bottleneck(j: int) -> float:
        send = net.latency_s + cut[j] / net.bandwidth_bytes_per_s if cut[j] > 0 else 0.0
        return max(times[0][j] + send, times[1][n] - times[1][j])

    best = min(bottleneck(j) for j in cuts if 0 < j < n)
    res = two_d(plan, ds, source=graph)
    assert bottleneck(res.stages[0].end) == pytest.approx(best, rel=1e-9)
    assert res.notes["stage_counts_tried"]["2"] == pytest.approx(best, rel=1e-9)


def test_two_d_needs_several_groups(llama):
    with pytest.raises(GraphoptError, match="several NVLink groups"):
        two_d(llama[0], parse_devices(TWO))


# --- auto ----------------------------------------------------------------------------------

def test_auto_picks_the_lowest_latency_and_keeps_the_losers(llama):
    plan, graph = llama
    out = with_partition(plan, NODES, "auto", source=graph)
    st = out.strategy
    cands = {c.strategy: c for c in st.candidates}
    assert set(cands) == {"heft", "pipeline", "tensor", "2d"}
    assert all(c.feasible and c.latency_s > 0 and c.throughput_per_s > 0
               for c in cands.values())
    # no nn.Module given (the traced graph only): the 2-D split is costed, shown, never picked
    assert not cands["2d"].emittable and "no nn.Module" in cands["2d"].not_emitted
    assert all(c.emittable for name, c in cands.items() if name != "2d")
    best = min((c for c in cands.values() if c.emittable), key=lambda c: c.latency_s)
    assert st.winner == best.strategy and st.picked_by == "latency for one request"
    assert "costed but not emitted, so never picked: 2d" in st.why
    assert st.why.startswith(f"{best.strategy} has the lowest latency")
    # pipeline and 2-D overlap micro-batches: their stream beats one request at a time
    assert cands["pipeline"].throughput_per_s > 1 / cands["pipeline"].latency_s
    assert cands["2d"].throughput_per_s > 1 / cands["2d"].latency_s


def test_auto_says_why_a_strategy_could_not_run(llama):
    plan, _ = llama
    cands = {c.name: c for c in compare(plan, parse_devices(
        "cuda:0=h100,cuda:1=h100,cuda:2=h100"))}
    assert not cands["tensor"].feasible and "splits no block" in cands["tensor"].why_not
    win, st = run_strategy(plan, parse_devices("cuda:0=h100,cuda:1=h100,cuda:2=h100"), "auto")
    assert win.name in ("heft", "pipeline") and "could not run: tensor" in st.why
    assert "2d" not in cands  # one NVLink group


# --- CLI and report ------------------------------------------------------------------------

def test_cli_auto_writes_the_sections_and_reports(tmp_path, capsys):
    spec = tmp_path / "m.py"
    spec.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                    "from tests.arch_zoo import build as _b\n"
                    "def build():\n    return _b('llama')\n")
    outs = []
    for i in range(2):
        out = tmp_path / f"p{i}.json"
        rc = main(["plan", f"{spec}:build", "--devices", NODES, "--strategy", "auto",
                   "--json", str(out), "--md", str(tmp_path / "p.md"),
                   "--html", str(tmp_path / "p.html")])
        assert rc == 0, capsys.readouterr().err
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]  # byte-deterministic
    plan = json.loads(outs[0])
    assert {c["strategy"] for c in plan["strategy"]["candidates"]} == {
        "heft", "pipeline", "tensor", "2d"}
    md = (tmp_path / "p.md").read_text()
    assert "## Strategy" in md and "(picked)" in md
    rc = main(["plan", f"{spec}:build", "--devices", NODES, "--strategy", "tensor",
               "--json", str(tmp_path / "t.json"), "--md", str(tmp_path / "t.md"),
               "--html", str(tmp_path / "t.html")])
    assert rc == 0
    plan = json.loads((tmp_path / "t.json").read_text())
    tp = plan["tensor_parallel"]
    assert tp["degree"] == 4 and tp["link"]["name"] == "net-400Gb/s"  # crosses the nodes
    assert any("KV heads do not divide" in f for f in tp["fallbacks"])
    assert "RowwiseParallel" in plan["tensor_parallel"]["parallelize_module"]["code"]


def test_report_renders_split_table_and_collective_bars(llama):
    plan, graph = llama
    out = with_partition(plan, TWO, "tensor", source=graph)
    data = json.loads(out.to_json())
    md = render_markdown(typed(data))
    assert "## Tensor parallelism" in md and "### Block splits" in md
    assert "| `attention@" in md and "N (heads)" in md and "K (intermediate)" in md
    assert "```python" in md and "RowwiseParallel()" in md
    assert "| `tensor (picked)` |" in md
    page = render_html(typed(data))
    assert page.count('class="gc"') == 2 * len(data["partition"]["collectives"]) == 4
    assert "Strategy and tensor parallelism" in page and 'class="tpcode"' in page
    assert render_html(typed(json.loads(json.dumps(data)))) == page


def test_two_d_report_has_stages_and_transfers(llama):
    plan, graph = llama
    res = two_d(plan, parse_devices(NODES), source=graph)
    from graphopt.partition.tp_attach import attach_split

    choice = StrategyChoice(Strategy.TWO_D, Strategy.TWO_D, False, "request", "asked", (), ())
    out = attach_split(plan, res, choice, source=graph)
    data = json.loads(out.to_json())
    md = render_markdown(typed(data))
    assert "### Stages (pipeline across groups)" in md
    assert "### 2-D plan (pipeline stages x tensor parallel)" in md and "micro-batches" in md
    assert "parallelize_module(model, mesh" not in md  # not the one-group plan
    assert data["partition"]["stage_devices"] == ["cuda:0+cuda:1", "cuda:2+cuda:3"]
    assert math.isclose(data["partition"]["makespan_s"], res.latency_s)
    assert len(data["partition"]["transfers"]) == 2
    page = render_html(typed(data))
    assert 'class="gc"' in page and "Stages (pipeline across groups)" in page
    assert "2-D plan (pipeline stages × tensor parallel)" in page and "GPipe" in page
