"""Running a partition: split modules with transfers, pipeline stages, workload placement."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx, nn

import graphopt
from graphopt.cost import link_between
from graphopt.errors import GraphoptError, TraceError
from graphopt.hardware import get_target
from graphopt.partition.devices import Device, DeviceSet
from graphopt.partition.emit import export_graph_module, split_module
from graphopt.partition.pipeline_stages import (
    build_pipeline_stages,
    microbatch,
    run_local_pipeline,
)
from graphopt.partition.result import Partition, ScheduledNode
from graphopt.partition.scheduler import (
    Workload,
    auto_migrate,
    schedule_workloads,
    utilization,
)
from tests.zoo import ResidualMLP, zoo

GiB = 2**30


def _device_set(*specs: tuple[str, str, int]) -> DeviceSet:
    devs = tuple(Device(name, get_target(target), mem) for name, target, mem in specs)
    links = {(a.name, b.name): link_between(a.profile, b.profile)
             for a in devs for b in devs if a is not b}
    return DeviceSet(devs, links)


CPUS = _device_set(("cpu:0", "cpu", 8 * GiB), ("cpu:1", "cpu", 8 * GiB),
                   ("cpu:2", "cpu", 8 * GiB))


def _partition(assignment: dict[str, str], devices: DeviceSet = CPUS,
               stages: tuple[tuple[str, ...], ...] = (),
               stage_devices: tuple[str, ...] = ()) -> Partition:
    sched = tuple(ScheduledNode(n, d, 0.0, 0.0, "by hand") for n, d in assignment.items())
    return Partition("pipeline" if stages else "heft", devices, sched, (), 0.0, {}, {},
                     stages, stage_devices)


def _compute(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def _alternating(gm: fx.GraphModule, every: int, names: list[str]) -> dict[fx.Node, str]:
    """Devices cycling every ``every`` compute nodes; a getitem stays with its producer."""
    dev: dict[fx.Node, str] = {}
    for i, n in enumerate(_compute(gm)):
        src = n.args[0] if n.target is operator.getitem else None
        dev[n] = dev[src] if isinstance(src, fx.Node) else names[(i // every) % len(names)]
    return dev


def _expected_transfers(dev: dict[fx.Node, str]) -> set[tuple[str, str]]:
    """(tensor, destination device) for every tensor read on another device than its own."""
    return {(p.name, dev[u]) for u in dev for p in u.all_input_nodes
            if p in dev and dev[p] != dev[u] and isinstance(p.meta.get("val"), torch.Tensor)}


def _assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=1e-6 * max(scale, 1.0))


@pytest.mark.parametrize("name", ["odd_residual_cnn", "transformer_hd72", "odd_mlp",
                                  "rmsnorm_swiglu"])
def test_split_module_matches_the_model(name: str) -> None:
    model, inputs = zoo()[name]
    gm = export_graph_module(model, inputs)
    dev = _alternating(gm, 3, ["cpu:0", "cpu:1", "cpu:2"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    split = split_module(model, inputs, _partition({n.name: d for n, d in dev.items()}))
    with torch.no_grad():
        _assert_same(split(*inputs), model(*inputs))
    got = {(t.tensor, t.dst_device) for t in split.transfers}
    assert got == _expected_transfers(dev)
    assert len(got) == len(split.transfers) >= 2  # each tensor moved once per device
    assert all(t.src_device != t.dst_device and t.nbytes > 0 for t in split.transfers)
    placed = {n: p.device for p in split.parts for n in p.nodes}
    assert placed == {n.name: d for n, d in dev.items()}
    runs_in_graph_order = 1 + sum(a != b for a, b in zip(list(dev.values()),
                                                         list(dev.values())[1:], strict=False))
    assert 2 <= len(split.parts) <= runs_in_graph_order
    assert all(a.device != b.device for a, b in zip(split.parts, split.parts[1:], strict=False))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    user_ptrs = {p.data_ptr() for p in model.parameters()}
    assert not user_ptrs & {p.data_ptr() for p in split.parameters()}  # copies, not aliases


class TwoBranches(nn.Module):
    """Two chains written interleaved, so graph order alternates between them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.b = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        a, b = x, y
        for la, lb in zip(self.a, self.b, strict=True):
            a, b = torch.relu(la(a)), torch.tanh(lb(b))
        return {"sum": a + b, "parts": (a, b)}


def test_heft_style_interleaving_gives_one_part_per_device_run() -> None:
    torch.manual_seed(0)
    model = TwoBranches().eval()
    inputs = (torch.randn(4, 16), torch.randn(4, 16))
    gm = export_graph_module(model, inputs)
    assign = {}
    for n in _compute(gm):  # branch b (weights b_*, tanh) on cpu:1, the rest on cpu:0
        reads_b = any(a.name.startswith("b_") for a in n.all_input_nodes if a.op == "get_attr")
        assign[n.name] = "cpu:1" if reads_b or n.name.startswith("tanh") else "cpu:0"
    split = split_module(model, inputs, _partition(assign))
    assert [p.device for p in split.parts] == ["cpu:0", "cpu:1", "cpu:0"]
    assert [(t.src_device, t.dst_device) for t in split.transfers] == [("cpu:1", "cpu:0")]
    assert {m.tensor for m in split.input_moves} == {"x", "y"}
    with torch.no_grad():
        got, want = split(*inputs), model(*inputs)
    assert set(got) == {"sum", "parts"} and isinstance(got["parts"], tuple)
    _assert_same(got["sum"], want["sum"])
    _assert_same(got["parts"][1], want["parts"][1])


def test_device_map_and_unknown_device_names() -> None:
    model, inputs = zoo()["odd_mlp"]
    gm = export_graph_module(model, inputs)
    devices = _device_set(("gpu_a", "h100-sxm", 70 * GiB), ("gpu_b", "a100-80gb", 70 * GiB))
    dev = _alternating(gm, 2, ["gpu_a", "gpu_b"])
    part = _partition({n.name: d for n, d in dev.items()}, devices)
    with pytest.raises(GraphoptError, match="device_map"):
        split_module(model, inputs, part)
    split = split_module(model, inputs, part, {"gpu_a": "cpu", "gpu_b": torch.device("cpu")},
                         output_device="cpu")
    with torch.no_grad():
        _assert_same(split(*inputs), model(*inputs))
    assert "to('cpu')" in split.code


class KeywordModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l, self.m = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return self.m(torch.relu(self.l(x)) + y)


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x


def test_keyword_inputs_and_models_export_cannot_capture() -> None:
    torch.manual_seed(0)
    model = KeywordModel().eval()
    inputs = {"x": torch.randn(2, 4), "y": torch.randn(2, 4)}
    dev = _alternating(export_graph_module(model, inputs), 1, ["cpu:0", "cpu:1"])
    split = split_module(model, inputs, _partition({n.name: d for n, d in dev.items()}))
    with torch.no_grad():
        _assert_same(split(**inputs), model(**inputs))
        _assert_same(split(inputs["x"], y=inputs["y"]), model(**inputs))
    with pytest.raises(TraceError, match="torch.export"):
        split_module(DataDependent(), torch.randn(3), _partition({}))


def _run_stages_in_process(stages, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    outs = []
    for mb in zip(*(t.tensor_split(stages.n_microbatches) for t in inputs), strict=True):
        values = tuple(mb)
        for i in range(stages.num_stages):
            values = stages.module(i)(*values)
        outs.append(stages.unflatten(values))
    return torch.cat(outs)


def test_pipeline_stages_pass_skip_connections_through() -> None:
    model, (x,) = zoo()["transformer_hd72"]
    inputs = (torch.cat([x, x.flip(0)]),)  # batch 4 -> 2 microbatches of 2
    names = [n.name for n in _compute(export_graph_module(model, microbatch(inputs, 2)))]
    cut1, cut2 = names.index("chunk"), names.index("add")
    stages = (tuple(names[:cut1]), tuple(names[cut1:cut2]), tuple(names[cut2:]))
    part = _partition({}, stages=stages, stage_devices=("cpu:0", "cpu:1", "cpu:2"))
    built = build_pipeline_stages(model, inputs, part, n_microbatches=2)
    first, middle, last = (p.info for p in built.parts)
    assert first.inputs == ("x",) and first.outputs == ("x", "linear")
    # stage 1 does not read x; it passes it on to stage 2's residual add
    assert middle.inputs == ("x", "linear") and middle.outputs == ("x", "linear_1")
    assert "x" not in {a.name for n in built.module(1).graph.nodes
                       if n.op == "call_function" for a in n.all_input_nodes}
    assert last.outputs == ("add_1",)
    assert [tuple(m.shape) for m in built.input_meta[1]] == [(2, 10, 288), (2, 10, 864)]
    with torch.no_grad():
        _assert_same(_run_stages_in_process(built, inputs), model(*inputs))


def test_pipeline_stage_errors() -> None:
    model, inputs = zoo()["odd_mlp"]  # batch 4
    with pytest.raises(GraphoptError, match="equal microbatches"):
        microbatch(inputs, 3)
    with pytest.raises(GraphoptError, match="no pipeline stages"):
        build_pipeline_stages(model, inputs, _partition({}), 2)
    names = [n.name for n in _compute(export_graph_module(model, microbatch(inputs, 2)))]
    with pytest.raises(GraphoptError, match="later stage"):
        build_pipeline_stages(model, inputs, [names[2:], names[:2]], 2)


def _residual_mlp() -> nn.Module:
    torch.manual_seed(0)
    return ResidualMLP(8).eval()


@pytest.mark.skipif(not torch.distributed.is_available()
                    or not torch.distributed.is_gloo_available(), reason="needs gloo")
def test_pipeline_two_processes_gloo() -> None:
    model = _residual_mlp()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    names = [n.name for n in _compute(export_graph_module(model, microbatch((x,), 4)))]
    stages = [names[: len(names) // 2], names[len(names) // 2:]]
    out = run_local_pipeline(_residual_mlp, (x,), stages, n_microbatches=4, timeout_s=120)
    with torch.no_grad():
        per_microbatch = torch.cat([model(mb) for mb in x.tensor_split(4)])
        whole = model(x)
    _assert_same(out, per_microbatch)
    torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)  # fp32, other GEMM shapes


@pytest.mark.parametrize("name", ["odd_residual_cnn", "transformer_hd72", "norm_zoo"])
def test_split_integration_when_the_splitter_exists(name: str) -> None:
    """The splitter's predicted transfers are exactly the ones the split module runs."""
    splitter = pytest.importorskip("graphopt.partition.splitter")
    model, inputs = zoo()[name]
    plan = graphopt.plan(model, inputs, target="h100-sxm")
    gpus = _device_set(("cuda:0", "h100-sxm", 70 * GiB), ("cuda:1", "a100-40gb", 35 * GiB))
    on_cpu = {"cuda:0": "cpu", "cuda:1": "cpu"}
    for strategy in ("heft", "pipeline"):
        part = splitter.split(plan, gpus, strategy=strategy)
        split = split_module(model, inputs, part, on_cpu)
        with torch.no_grad():
            _assert_same(split(*inputs), model(*inputs))
        assert ({(t.tensor, t.src_device, t.dst_device) for t in split.transfers}
                == {(t.tensor, t.src_device, t.dst_device) for t in part.transfers})
    assert len(part.stages) == 2
    built = build_pipeline_stages(model, inputs, part, n_microbatches=2, device_map=on_cpu)
    with torch.no_grad():
        _assert_same(_run_stages_in_process(built, inputs), model(*inputs))


# --- whole-workload scheduling ------------------------------------------------------------

GPUS = _device_set(("fast", "h100-sxm", 70 * GiB), ("slow", "a100-40gb", 35 * GiB))


def test_workload_latency_uses_the_plans_cost_model() -> None:
    model, inputs = zoo()["odd_mlp"]
    w = Workload.of("mlp", graphopt.plan(model, inputs, target="h100-sxm"), priority=1)
    a100 = graphopt.plan(model, inputs, target="a100-40gb")
    assert w.latency_on(get_target("a100-40gb")) == pytest.approx(a100.est_latency_s)
    assert w.memory_bytes == a100.model.param_bytes > 0
    with pytest.raises(GraphoptError, match="no latency"):
        Workload("x", {"h100-sxm": 1.0}).latency_on(get_target("a100-40gb"))


def _w(name: str, fast: float, slow: float, priority: int = 0, mem: int = GiB) -> Workload:
    return Workload(name, {"h100-sxm": fast, "a100-40gb": slow}, priority, 1.0, mem)


def test_round_robin_skips_devices_without_memory() -> None:
    ws = [_w("a", 0.1, 0.2), _w("b", 0.1, 0.2, mem=40 * GiB), _w("c", 0.1, 0.2)]
    got = schedule_workloads(ws, GPUS, "round_robin")
    assert [p.device for p in got] == ["fast", "fast", "slow"]
    assert "skipped 1" in got[1].reason
    with pytest.raises(GraphoptError, match="fits on no device"):
        schedule_workloads([_w("huge", 1, 1, mem=100 * GiB)], GPUS, "round_robin")
    with pytest.raises(GraphoptError, match="unknown scheduling policy"):
        schedule_workloads(ws, GPUS, "fifo")  # type: ignore[arg-type]


def test_load_balanced_spreads_by_estimated_time() -> None:
    ws = [_w("s1", 0.1, 0.15), _w("big", 0.5, 0.8), _w("s2", 0.1, 0.15), _w("mid", 0.3, 0.45)]
    got = schedule_workloads(ws, GPUS, "load_balanced")
    assert [p.workload for p in got] == ["s1", "big", "s2", "mid"]  # input order kept
    assert got[1].device == "fast" and got[3].device == "slow"  # longest first, to fastest
    peak = max(utilization(got, GPUS).values())
    rr = max(utilization(schedule_workloads(ws, GPUS, "round_robin"), GPUS).values())
    assert peak < rr and peak <= 0.75
    assert all("least load" in p.reason for p in got)


def test_priority_puts_the_most_important_on_the_fastest_device() -> None:
    ws = [_w("batch", 0.4, 0.6, priority=0), _w("chat", 0.4, 0.6, priority=9)]
    got = {p.workload: p for p in schedule_workloads(ws, GPUS, "priority")}
    assert got["chat"].device == "fast" and got["batch"].device == "slow"
    assert got["chat"].reason.startswith("priority 9")
    lb = {p.workload: p for p in schedule_workloads(ws, GPUS, "load_balanced")}
    assert lb["batch"].device == "fast"  # without priorities the first listed wins the tie


def test_auto_migration_moves_the_cheapest_workload_off_a_hot_device() -> None:
    ws = [_w("heavy", 0.5, 0.7, mem=20 * GiB), _w("x", 0.1, 0.2), _w("light", 0.4, 0.5, mem=GiB),
          _w("y", 0.05, 0.1)]
    rr = schedule_workloads(ws, GPUS, "round_robin")  # heavy + light on fast: 90%
    assert utilization(rr, GPUS)["fast"] == pytest.approx(0.9)
    moved = schedule_workloads(ws, GPUS, "round_robin", migrate_above=0.8)
    by = {p.workload: p for p in moved}
    assert by["light"].device == "slow" and by["light"].migrated_from == "fast"
    assert by["heavy"].device == "fast" and by["heavy"].migrated_from is None
    assert "cheapest to move" in by["light"].reason
    assert max(utilization(moved, GPUS).values()) < 0.9
    assert auto_migrate(rr, ws, GPUS, threshold=0.95) == rr  # under the threshold: no move


def test_auto_migration_never_makes_the_peak_worse() -> None:
    ws = [_w("solo", 0.9, 2.0)]  # 90% on fast; on slow it would be 200%
    got = schedule_workloads(ws, GPUS, "load_balanced", migrate_above=0.5)
    assert got[0].device == "fast" and got[0].migrated_from is None
    same = _device_set(("g0", "h100-sxm", 70 * GiB), ("g1", "h100-sxm", 70 * GiB))
    placed = schedule_workloads([_w("a", 0.9, 1.0)], same, "round_robin", migrate_above=0.5)
    assert placed[0].device == "g0"  # moving it to an equal idle device would not lower it
