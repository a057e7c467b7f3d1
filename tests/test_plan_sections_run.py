"""The plan sections that optimize, the deploy choice and partitioning fill are typed records
(issue 32, parts B and D): each reads back equal through ``Plan.from_json``, and is read by
attribute; ``Optimized.info`` is the plan's ``optimization`` record.
"""

from __future__ import annotations

import json

import pytest

import graphopt
from graphopt.api.planning import with_partition
from graphopt.decisions.planner import build_plan
from graphopt.errors import GraphoptError
from graphopt.frontends import load_graph
from graphopt.frontends.onnx_export import export_torch
from graphopt.hardware import get_target
from graphopt.ir.plan import Plan
from graphopt.ir.plan_deploy import ARTIFACTS, Artifact, ArtifactTiming, DeployChoice
from graphopt.ir.plan_parallel import (
    ParallelizePlan,
    TensorParallelPlan,
    TwoDParallelPlan,
)
from graphopt.ir.plan_partition import (
    HeftNotes,
    PartitionPlan,
    PipelineNotes,
    Strategy,
    StrategyChoice,
    TensorNotes,
    TwoDNotes,
)
from graphopt.ir.plan_run import (
    OnnxExport,
    OnnxGuard,
    OnnxOptimization,
    OutputNumerics,
    PassReverted,
    PrecisionChoice,
    ToleranceBudget,
    TorchOptimization,
)
from graphopt.ir.shape_range import ShapeRange
from graphopt.partition import parse_devices
from graphopt.partition.tp_attach import attach_split
from graphopt.partition.two_d import two_d
from tests import zoo
from tests.arch_zoo import build
from tests.plan_round_trip import round_trip
from tests.test_two_d_run import NODES, _ids, tiny

TWO = "cuda:0=h100,cuda:1=h100"


@pytest.fixture(scope="module")
def llama() -> tuple[Plan, object]:
    model, inputs = build("llama")
    graph = load_graph(model, inputs)
    return build_plan(graph, get_target("h100")), graph


def test_an_optimized_plan_has_a_typed_deploy_choice() -> None:
    model, example = zoo.zoo()["odd_residual_cnn"]
    opt = graphopt.optimize(model, example, target="h100", measure=False)
    back = round_trip(opt.plan)
    assert isinstance(back.deploy, DeployChoice) and back.deploy == opt.deploy
    assert back.deploy.artifact in ARTIFACTS and not back.deploy.measured
    assert [c.artifact for c in back.deploy.candidates] == list(ARTIFACTS)
    assert all(c.rounds == () for c in back.deploy.candidates)  # not in the report
    data = json.loads(opt.plan.to_json())["deploy"]
    assert data["artifact"] == back.deploy.artifact.value
    assert "rounds" not in data["candidates"][0]


def test_an_optimized_and_exported_plan_has_typed_run_sections(tmp_path) -> None:
    model, example = zoo.zoo()["odd_mlp"]
    opt = graphopt.optimize(model, example, target="h100", measure=False)
    assert isinstance(opt.info, TorchOptimization) and opt.plan.optimization is opt.info
    assert opt.onnx_info is None and opt.plan.onnx_optimization is None
    opt.export_onnx(tmp_path / "m.onnx")
    back = round_trip(opt.plan)
    run, onnx_run = back.optimization, back.onnx_optimization
    assert isinstance(run, TorchOptimization) and run == opt.info
    assert isinstance(onnx_run, OnnxExport) and onnx_run == opt.onnx_info
    assert isinstance(run.tolerance, ToleranceBudget) and run.compute_dtype == "bf16"
    assert all(isinstance(n, OutputNumerics) and isinstance(n.output, int) and n.snr_db is None
               for n in run.numerics)
    assert onnx_run.exporter and onnx_run.opset and onnx_run.decisions
    assert onnx_run.guard and all(isinstance(g, OnnxGuard) for g in onnx_run.guard)
    assert {g.name for g in onnx_run.guard} <= {"precision", "quantize"}  # the lossy passes
    data = json.loads(opt.plan.to_json())
    assert "snr_db" not in data["optimization"]["numerics"][0]  # the torch rows have none
    assert {"exporter", "opset", "decisions", "snr_db"} <= set(data["onnx_optimization"]) | set(
        data["onnx_optimization"]["numerics"][0])
    # a torch run's JSON is no ONNX run: each reads as its own record or not at all
    with pytest.raises(GraphoptError, match="OnnxOptimization"):
        OnnxOptimization.from_json(data["optimization"])


def test_an_onnx_file_optimize_has_a_typed_run_section(tmp_path) -> None:
    model, example = zoo.zoo()["odd_mlp"]
    src = tmp_path / "m.onnx"
    src.write_bytes(export_torch(model, example).model.SerializeToString())
    opt = graphopt.optimize(str(src), target="cpu", measure=False, quantize="none")
    back = round_trip(opt.plan)
    run = back.optimization
    assert isinstance(run, OnnxOptimization) and not isinstance(run, OnnxExport)
    assert run == opt.info and back.onnx_optimization is None
    assert isinstance(run.precision_choice, PrecisionChoice) and run.source == "onnx"
    assert run.numerics and all(n.finite is True and n.nonfinite == 0 for n in run.numerics)
    # an output the passes left exact has an infinite SNR, which JSON holds as "inf"
    assert all(isinstance(n.snr_db, float) or n.snr_db == "inf" for n in run.numerics)
    assert opt.numerics == [n.to_json() for n in run.numerics]
    assert all(isinstance(r, PassReverted) for r in run.passes_reverted)
    assert run.shape_range is None or isinstance(run.shape_range, ShapeRange)
    data = json.loads(opt.plan.to_json())
    bad = {**data["optimization"], "passes_reverted": [{"pass": 1, "reason": "r"}]}
    with pytest.raises(GraphoptError, match="optimization"):
        Plan.from_json({**data, "optimization": bad})


def test_the_deploy_speedups_are_computed_when_the_choice_is_made() -> None:
    rows = (ArtifactTiming(Artifact.TORCH, 2e-3, True),
            ArtifactTiming(Artifact.TORCH_COMPILE, None, None, error="boom"),
            ArtifactTiming(Artifact.ONNXRUNTIME, 1e-3, True, rounds=(1e-3, 1.1e-3)))
    choice = DeployChoice.of(Artifact.ONNXRUNTIME, True, "why", rows, "how", original_s=4e-3)
    assert choice.speedup_vs_torch_module == pytest.approx(2.0)
    assert choice.speedup_vs_original == pytest.approx(4.0)
    assert DeployChoice.from_json(choice.to_json()) == DeployChoice.of(
        Artifact.ONNXRUNTIME, True, "why", (*rows[:2], ArtifactTiming(
            Artifact.ONNXRUNTIME, 1e-3, True)), "how", original_s=4e-3)
    with pytest.raises(GraphoptError, match="artifact"):
        DeployChoice.from_json({**choice.to_json(), "artifact": "tensorrt"})


def test_a_tensor_parallel_plan_reads_back_as_records(llama) -> None:
    plan, graph = llama
    out = round_trip(with_partition(plan, TWO, "tensor", source=graph))
    assert isinstance(out.partition, PartitionPlan)
    assert isinstance(out.partition.notes, TensorNotes)
    assert isinstance(out.tensor_parallel, TensorParallelPlan)
    assert isinstance(out.tensor_parallel.parallelize_module, ParallelizePlan)
    assert isinstance(out.strategy, StrategyChoice) and out.strategy.winner is Strategy.TENSOR
    assert out.tensor_parallel.devices[0].group == 0


def test_auto_over_two_machines_reads_back_as_records(llama) -> None:
    plan, graph = llama
    out = round_trip(with_partition(plan, NODES, "auto", source=graph))
    assert {c.strategy for c in out.strategy.candidates} == {
        Strategy.HEFT, Strategy.PIPELINE, Strategy.TENSOR, Strategy.TWO_D}
    assert out.strategy.requested is Strategy.AUTO
    assert isinstance(out.partition.notes, (HeftNotes, PipelineNotes))


@pytest.mark.parametrize(("strategy", "notes"), [("heft", HeftNotes),
                                                  ("pipeline", PipelineNotes)])
def test_a_split_reads_back_with_its_strategy_notes(llama, strategy, notes) -> None:
    plan, graph = llama
    out = round_trip(with_partition(plan, TWO, strategy, source=graph))
    assert isinstance(out.partition.notes, notes) and out.partition.strategy == strategy
    assert out.partition.collectives is None and "collectives" not in json.loads(
        out.to_json())["partition"]


def test_a_two_d_split_reads_back_as_records() -> None:
    model = tiny()
    plan = graphopt.plan(model, (_ids(),), target="h100-sxm")
    res = two_d(plan, parse_devices(NODES), source=model)
    choice = StrategyChoice(Strategy.TWO_D, Strategy.TWO_D, False, "request", "asked", (), ())
    out = round_trip(attach_split(plan, res, choice, source=model, module=model))
    assert isinstance(out.tensor_parallel, TwoDParallelPlan)
    assert isinstance(out.partition.notes, TwoDNotes)
    assert out.partition.notes.makespan_is == out.partition.notes.latency_is
    assert out.tensor_parallel.notes.makespan_is is None  # on the timeline only
    assert out.tensor_parallel.pipeline.emitted is None  # costed, not on module boundaries
