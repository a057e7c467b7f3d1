"""The HTML report's embedded node data: interned tables that decode back to the plan's records.

The plans are real (``build_plan`` on repeated residual blocks, the shape of a deep model) and
hand-made (hostile names, several targets). Sizes are checked in bytes per node, never in time.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from graphopt.decisions.planner import build_plan
from graphopt.hardware import get_target
from graphopt.ir.plan import NodePlan, Plan
from graphopt.partition import apply_partition, split
from graphopt.report.format import (
    HEAD_KINDS,
    decision_fields,
    decision_head,
    decision_summary,
    fmt_dims,
    fmt_shape,
    ordered_kinds,
    plans_of,
)
from graphopt.report.html import render_html
from tests.irbuild import G
from tests.report_plans import typed
from tests.test_report_partition import with_partition
from tests.test_report_render import embedded_data, make_multi, make_optimized, make_plan


def blocks_plan(blocks: int) -> Plan:
    """A real plan of ``blocks`` x (MatMul, bias Add, residual Add, LayerNorm) on an H100."""
    g = G()
    x = g.input("x", (16, 64))
    for i in range(blocks):
        w, b = g.param(f"w{i}", (64, 64)), g.param(f"b{i}", (64,))
        gamma, beta = g.param(f"g{i}", (64,)), g.param(f"beta{i}", (64,))
        mm = g.op("MatMul", [x, w], (16, 64), name=f"layers.{i}.mm")
        lin = g.op("Add", [mm, b], (16, 64), name=f"layers.{i}.bias")
        res = g.op("Add", [x, lin], (16, 64), name=f"layers.{i}.residual")
        x = g.op("LayerNormalization", [res, gamma, beta], (16, 64), name=f"layers.{i}.norm",
                 axis=-1, epsilon=1e-5)
    return build_plan(g.build([x]), get_target("h100"))


def repeated_blocks(blocks: int) -> dict[str, Any]:
    """``blocks_plan`` as the JSON report holds it."""
    return json.loads(json.dumps(blocks_plan(blocks).to_dict()))


def split_plan(blocks: int) -> Plan:
    """``blocks_plan`` in two pipeline stages: every node gets its own device decision."""
    plan = blocks_plan(blocks)
    return apply_partition(plan, split(plan, "cuda:0=h100,cuda:1=h100", "pipeline"))


def split_blocks(blocks: int) -> dict[str, Any]:
    """``split_plan`` as the JSON report holds it."""
    return json.loads(json.dumps(split_plan(blocks).to_dict()))


def _close(got: Any, want: Any) -> bool:
    """Numbers are embedded with six significant digits; non-finite ones as null."""
    if want is None or (isinstance(want, float) and not math.isfinite(want)):
        return got is None
    return got == pytest.approx(want, rel=1e-5, abs=0)


def _intensity(n: dict[str, Any]) -> float | None:
    """FLOP per byte as the page shows it: zero (a view) or missing is derived, else no value."""
    ai = n.get("arithmetic_intensity")
    if ai and ai > 0:
        return ai
    return n["flops"] / n["bytes"] if n.get("flops") and n.get("bytes") else None


def _check_node(row: dict[str, Any], n: dict[str, Any]) -> None:
    for key in ("name", "op", "op_type", "kernel_class", "dtype", "flops", "bytes", "bytes_read",
                "bytes_written", "params", "pattern", "flags"):
        assert row[key] == n[key], key
    assert row["dims"] == fmt_dims(n["dims"])
    assert _close(row["ai"], _intensity(n))
    for side in ("inputs", "outputs"):
        assert row[side] == [[t["name"], fmt_shape(t["shape"]), t["dtype"]] for t in n[side]]


def _check_target(per: dict[str, Any], x: dict[str, Any], node: NodePlan) -> None:
    """``x``: the node's JSON record; ``node``: the same node as the renderer reads it."""
    for key in ("est_time_s", "compute_time_s", "memory_time_s", "peak_flops_used"):
        assert _close(per[key], x[key]), key
    assert per["bottleneck"] == x["bottleneck"] and per["flops"] == x["flops"]
    assert _close(per["ai"], _intensity(x))
    ds = node.decisions
    assert per["dhead"] == decision_head(ds)
    assert per["decisions"] == [
        [k, decision_summary(ds[k]), ds[k].reason, [list(f) for f in decision_fields(ds[k])],
         int(ds[k].applied), int(k in HEAD_KINDS)] for k in ordered_kinds(ds)]
    assert [k for k, _ in per["cost"]] == sorted(k for k, v in (x.get("cost") or {}).items()
                                                 if v not in (None, ""))


@pytest.mark.parametrize("report", [
    pytest.param(lambda: repeated_blocks(6), id="real-plan"),
    pytest.param(lambda: split_blocks(6), id="real-split"),
    pytest.param(make_optimized, id="hostile-names"),
    pytest.param(lambda: with_partition(make_plan()), id="partition"),
    pytest.param(make_multi, id="two-targets"),
])
def test_decoded_rows_are_the_plan_records(report: Any) -> None:
    report = report()
    plans, read = report.get("plans") or [report], plans_of(typed(report))
    data = embedded_data(render_html(typed(report)))
    fields, tfields = data["fields"], data["tfields"]
    assert len(data["rows"]) == len(plans[0]["nodes"])
    for i, values in enumerate(data["rows"]):
        row = dict(zip(fields, values, strict=True))
        _check_node(row, plans[0]["nodes"][i])
        assert len(row["per"]) == len(plans)
        for t, plan in enumerate(plans):
            _check_target(dict(zip(tfields, row["per"][t], strict=True)), plan["nodes"][i],
                          read[t].nodes[i])


def test_a_plan_and_its_json_read_back_give_the_same_page() -> None:
    """The tables find repeated values by value: a plan built here (whose nodes share tensor and
    decision objects) and the same plan read back from its JSON (every object its own) give
    the same bytes."""
    for built in (blocks_plan(6), split_plan(6)):
        read = Plan.from_json(json.loads(json.dumps(built.to_dict())))
        assert render_html(read) == render_html(built)


def test_a_target_without_the_node_decodes_to_null() -> None:
    report = make_multi()
    report["plans"][1]["nodes"].pop(2)  # the A100 plan lacks the hostile node
    data = embedded_data(render_html(typed(report)))
    per = data["rows"][2][data["fields"].index("per")]
    assert per[0] is not None and per[1] is None
    assert sum(r[data["fields"].index("per")][1] is None for r in data["rows"]) == 1


def test_each_distinct_reason_is_embedded_once() -> None:
    plan = repeated_blocks(40)
    page = render_html(typed(plan))
    reasons = {d["reason"] for n in plan["nodes"] for d in n["decisions"].values()}
    assert len(reasons) >= 4  # per op kind, the same on all 40 blocks
    for reason in reasons:
        text = json.dumps(reason)[1:-1].replace("<", "\\u003c").replace(">", "\\u003e") \
            .replace("&", "\\u0026")
        assert page.count(text) == 1, reason
    data = embedded_data(page)
    # one per op of the block (the first and last GEMM are decided apart): layers repeat
    assert len(data["profiles"]) <= 6 and len(data["rows"]) == 160


def test_bytes_per_node_do_not_carry_the_reasons() -> None:
    small, large = repeated_blocks(25), repeated_blocks(250)
    added = len(large["nodes"]) - len(small["nodes"])
    per_node = (len(render_html(typed(large))) - len(render_html(typed(small)))) / added
    reasons = sum(len(d["reason"]) for n in large["nodes"] for d in n["decisions"].values())
    # each node's reasons alone are ~250 bytes; its name, tensors and indices ~80 (the old
    # format, one array per node with every reason and field written out, took ~1,030)
    assert reasons / len(large["nodes"]) > 200
    assert per_node < 150, per_node


def test_distinct_numbers_still_share_the_decisions() -> None:
    plan = repeated_blocks(30)
    for i, n in enumerate(plan["nodes"]):  # every node its own time: no two profiles alike
        n["est_time_s"] *= 1 + i / 1000
    data = embedded_data(render_html(typed(plan)))
    assert len(data["profiles"]) == len(plan["nodes"])
    assert len(data["dsets"]) <= 6 and len(data["decisions"]) <= 10
    assert data["rows"][7][data["fields"].index("per")][0][0] == pytest.approx(
        plan["nodes"][7]["est_time_s"], rel=1e-5)


def test_a_split_plan_still_shares_profiles() -> None:
    """Each node's device decision (its start and finish) is its own; the rest is shared."""
    report = split_blocks(30)
    data = embedded_data(render_html(typed(report)))
    devices = {n["decisions"]["device"]["start_s"] for n in report["nodes"]}
    assert len(devices) > 100  # the per-node part is really per node
    assert len(data["profiles"]) <= 6 and len(data["dsets"]) >= len(devices)
    per = data["rows"][50][data["fields"].index("per")][0]
    kinds = [d[0] for d in per[data["tfields"].index("decisions")]]
    assert kinds == ordered_kinds(typed(report).nodes[50].decisions) and "device" in kinds
