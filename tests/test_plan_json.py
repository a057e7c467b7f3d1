"""The plan's JSON reads back into the plan it was written from (issue 32: one schema, both ways).

``Plan.from_json(p.to_json())`` must equal ``p`` field for field (nodes, decisions, target,
summary and every section), and write the same JSON again; a report of another schema version,
an unknown key or a value of the wrong type is refused with a GraphoptError that names it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

import graphopt
from graphopt.ir.decision_details import (
    DETAILS,
    ExecPath,
    LayoutFormat,
    PaddingDetail,
    PaddingSkip,
    read_detail,
)
from graphopt.ir.plan import SCHEMA_VERSION, Plan
from graphopt.ir.plan_summary import ModelInfo, Summary, TensorSpec
from graphopt.ir.records import Record, optional
from tests import arch_zoo, zoo
from tests.plan_round_trip import round_trip

_ZOO = ["odd_residual_cnn", "transformer_hd72", "rmsnorm_swiglu", "convnet_grouped_depthwise"]


@pytest.mark.parametrize("target", ["h100", "cpu"])
@pytest.mark.parametrize("name", _ZOO)
def test_a_zoo_plan_reads_back_equal(name: str, target: str) -> None:
    model, example = zoo.zoo()[name]
    round_trip(graphopt.plan(model, example, target=target))


def test_a_transformers_plan_reads_back_equal() -> None:
    model, example = arch_zoo.build("llama")
    round_trip(graphopt.plan(model, example, target="h100"))


def test_an_optimized_plan_with_every_section_reads_back_equal() -> None:
    model, example = zoo.zoo()["odd_residual_cnn"]
    plan = graphopt.optimize(model, example, target="h100", measure=False).plan
    assert {"fusion", "memory", "quantization", "runtime_settings", "optimization",
            "deploy"} <= set(plan.sections())
    round_trip(plan)


def test_the_summary_and_model_are_records_read_by_attribute() -> None:
    model, example = zoo.zoo()["odd_residual_cnn"]
    plan = graphopt.plan(model, example, target="h100")
    assert isinstance(plan.model, ModelInfo) and isinstance(plan.summary, Summary)
    assert plan.model.inputs[0] == TensorSpec("x", tuple(example[0].shape), "fp32")
    assert plan.summary.node_count == len(plan.nodes)
    assert plan.summary.est_latency_fused_s is not None


def test_another_schema_version_is_refused_by_name() -> None:
    model, example = zoo.zoo()["odd_mlp"]
    data = graphopt.plan(model, example, target="h100").to_dict()
    data["schema_version"] = SCHEMA_VERSION - 1
    with pytest.raises(graphopt.GraphoptError, match="schema_version"):
        Plan.from_json(data)


def test_an_unknown_or_mistyped_key_is_refused_by_path() -> None:
    model, example = zoo.zoo()["odd_mlp"]
    data = graphopt.plan(model, example, target="h100").to_dict()
    typo = json.loads(json.dumps(data))
    typo["summary"]["est_latncy_s"] = 1.0
    with pytest.raises(graphopt.GraphoptError, match="est_latncy_s"):
        Plan.from_json(typo)
    wrong = json.loads(json.dumps(data))
    wrong["model"]["num_nodes"] = "many"
    with pytest.raises(graphopt.GraphoptError, match=r"model\.num_nodes"):
        Plan.from_json(wrong)
    with pytest.raises(graphopt.GraphoptError, match="not a graphopt plan"):
        Plan.from_json({"schema_version": SCHEMA_VERSION})


def test_each_decision_reads_back_as_its_kinds_record() -> None:
    model, example = zoo.zoo()["odd_residual_cnn"]
    plan = graphopt.plan(model, example, target="h100")
    back = Plan.from_json(plan.to_json())
    seen = set()
    for node, read in zip(plan.nodes, back.nodes, strict=True):
        for kind, d in node.decisions.items():
            assert type(read.decisions[kind].detail) is type(d.detail), (node.name, kind)
            assert isinstance(d.detail, DETAILS[kind]) and d.kind == kind, (node.name, kind)
            seen.add(kind)
    assert {"exec_path", "precision", "padding", "layout", "fold"} <= seen, seen
    convs = [n for n in back.nodes if n.op_type == "Conv"]
    assert all(isinstance(n.decisions["exec_path"].detail.path, ExecPath) for n in convs)
    assert all(isinstance(n.decisions["layout"].detail.format, LayoutFormat) for n in convs)
    padded = [n.decisions["padding"].detail for n in convs]
    assert all(isinstance(p, PaddingDetail) for p in padded), padded
    assert any(p.candidate for p in padded), padded  # a declined pad names what it weighed


def test_an_unknown_decision_kind_or_key_is_refused_by_path() -> None:
    model, example = zoo.zoo()["odd_residual_cnn"]
    data = graphopt.plan(model, example, target="h100").to_dict()
    node = next(i for i, n in enumerate(data["nodes"]) if n["op_type"] == "Conv")
    name = data["nodes"][node]["name"]
    kind = json.loads(json.dumps(data))
    kind["nodes"][node]["decisions"]["paddng"] = kind["nodes"][node]["decisions"]["padding"]
    with pytest.raises(graphopt.GraphoptError, match="'paddng'"):
        Plan.from_json(kind)
    key = json.loads(json.dumps(data))
    key["nodes"][node]["decisions"]["precision"]["formt"] = "bf16"
    with pytest.raises(graphopt.GraphoptError,
                       match=rf"nodes\[{name}\]\.decisions\.precision .*'formt'"):
        Plan.from_json(key)
    typed = json.loads(json.dumps(data))
    typed["nodes"][node]["decisions"]["exec_path"]["path"] = "warp_drive"
    with pytest.raises(graphopt.GraphoptError, match=r"exec_path\.path"):
        Plan.from_json(typed)
    assert read_detail("padding", {}) == PaddingSkip()  # the one padding with no sizes


@dataclass(frozen=True)
class _Inner(Record):
    n: int
    tags: tuple[str, ...]


@dataclass(frozen=True)
class _Outer(Record):
    inner: _Inner
    by_name: dict[str, _Inner]
    ratio: float
    maybe: int | None = optional()


def test_a_record_writes_and_reads_its_own_json() -> None:
    r = _Outer(_Inner(2, ("a", "b")), {"x": _Inner(1, ())}, 3, None)
    data = r.to_json()
    assert data == {"inner": {"n": 2, "tags": ["a", "b"]}, "by_name": {"x": {"n": 1, "tags": []}},
                    "ratio": 3}
    assert "maybe" not in data  # left out while None
    back = _Outer.from_json(json.loads(json.dumps(data)))
    assert back == r and type(back.ratio) is int  # an int read as float stays an int
    with pytest.raises(graphopt.GraphoptError, match=r"inner\.n"):
        _Outer.from_json({**data, "inner": {"n": True, "tags": []}})
