"""One plan, decided once: a model gets the same decisions as torch and as its ONNX export.

Each zoo architecture is optimized for h100, a100 and cpu twice: as the torch module, and as
the ONNX file graphopt exports from it. For every conv and weight GEMM, in graph order, the
padding, layout and precision decisions must agree, and the predicted padding gains must be
within 5%. A difference is allowed only with a reason one backend states (it has no legal
edit, or its input lacks what the decision needs); each allowed difference is listed by
:func:`_excused`, and anything else fails.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

import pytest
import torch

import graphopt
from graphopt.frontends.onnx_export import export_torch
from graphopt.ir.decision_details import PaddingDetail
from graphopt.ir.plan import Decision, NodePlan

pytest.importorskip("transformers")

from tests.arch_zoo import ARCHS, build  # noqa: E402 - needs transformers
from tests.hostisa import host_isa  # noqa: E402

pytestmark = [pytest.mark.zoo,
              pytest.mark.filterwarnings("ignore::DeprecationWarning",
                                         "ignore::FutureWarning", "ignore::UserWarning")]

_GEMMS = ("Conv", "ConvTranspose", "Linear", "Gemm", "MatMul")
_TARGETS = ("h100", "a100", "cpu")


@functools.cache
def _models(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], Any]:
    model, inputs = build(name)
    return model, inputs, export_torch(model, inputs).model


def _weight_nodes(plan: Any) -> list[NodePlan]:
    """Convs and GEMMs with a constant weight, in graph order."""
    return [n for n in plan.nodes if n.op_type in _GEMMS and len(n.inputs) > 1
            and n.inputs[1] is not None and n.inputs[1].kind in ("param", "constant")]


def _key(n: NodePlan) -> tuple[Any, ...]:
    """What pairs a torch node with its ONNX counterpart: conv weights keep their layout,
    GEMM weights are [N, K] in torch and [K, N] in ONNX."""
    shape = tuple(n.inputs[1].shape or ())  # type: ignore[union-attr]
    return ("conv", shape) if n.op_type.startswith("Conv") else ("gemm", tuple(sorted(shape)))


def _gain(d: Decision | None) -> float | None:
    return d.detail.predicted_gain if d is not None and isinstance(d.detail, PaddingDetail) \
        else None


def _same_padding(t: Decision | None, o: Decision | None) -> bool:
    if (t is None) != (o is None):
        return False
    if t is None or o is None:
        return True
    gt, go = _gain(t), _gain(o)
    gains = gt == go or (gt is not None and go is not None and abs(gt - go) <= 0.05 * gt)
    return t.applied == o.applied and gains and (t.applied or t.reason.split(":")[0] ==
                                                 o.reason.split(":")[0])


def _same_layout(t: Decision | None, o: Decision | None) -> bool:
    return (t and (t.applied, t.reason)) == (o and (o.applied, o.reason))


def _precision(d: Decision | None, onnx_fp16: bool) -> tuple[Any, ...] | None:
    """(format, reason) with bf16 read as fp16 where the ONNX side runs bf16 as fp16 (its
    stated reason: ONNX has no bf16 Conv, ORT's CPU EP no bf16 kernels)."""
    if d is None:
        return None
    fmt, reason = d.detail.format, d.reason
    if onnx_fp16 and fmt == "bf16":
        fmt, reason = "fp16", reason.replace("bf16", "fp16")
    return fmt, reason


def _excused(kind: str, t: NodePlan | None, o: NodePlan | None) -> str | None:
    """The reason a backend states for a difference, or None (the difference is a bug)."""
    if o is None:
        return "not in the ONNX export: the exporter drops work no graph output reads"
    if t is None:
        d = o.decisions.get("padding")
        if d is not None and not d.applied and "not a 2-D matrix" in d.reason:
            return "ONNX writes the experts' grouped GEMM as a batched MatMul"
        return None
    do, dt = o.decisions.get(kind), t.decisions.get(kind)
    ort_fp32 = "ORT's CPU EP has no native bf16/fp16 kernels" in str(o.decisions.get(
        "precision"))
    if kind == "precision" and ort_fp32 and dt is not None and \
            dt.detail.format in ("bf16", "fp16"):
        return "ORT's CPU EP has no bf16/fp16 kernels: the ONNX model stays fp32"
    if kind == "layout" and do is not None and dt is not None:
        # ORT running fp32 (above) changes only the bytes each conversion is costed at
        same_rule = do.reason == dt.reason or ort_fp32
        if do.detail.backend is not None and same_rule:
            return f"ONNX Runtime: {do.detail.backend}"
        if ort_fp32 and do.applied == dt.applied:
            return "the same layout; its conversions costed at 4-byte fp32, as ORT runs it"
    return None


def _compare(name: str, target: str) -> list[str]:
    model, inputs, proto = _models(name)
    torch_plan = graphopt.optimize(model, inputs, target=target, measure=False).plan
    onnx_opt = graphopt.optimize(proto, target=target, measure=False)
    onnx_fp16 = "bf16 becomes fp16" in onnx_opt.info.precision_choice.reason
    ts, os_ = _weight_nodes(torch_plan), _weight_nodes(onnx_opt.plan)
    pairs: list[tuple[NodePlan | None, NodePlan | None]] = []
    sm = difflib.SequenceMatcher(a=[_key(n) for n in ts], b=[_key(n) for n in os_],
                                 autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            pairs += zip(ts[i1:i2], os_[j1:j2], strict=True)
        else:
            pairs += [(t, None) for t in ts[i1:i2]] + [(None, o) for o in os_[j1:j2]]
    problems = []
    for t, o in pairs:
        if t is None or o is None:
            if _excused("padding", t, o) is None:
                problems.append(f"unpaired {(t or o).name}")  # type: ignore[union-attr]
            continue
        checks = {
            "padding": _same_padding(t.decisions.get("padding"), o.decisions.get("padding")),
            "layout": _same_layout(t.decisions.get("layout"), o.decisions.get("layout")),
            "precision": _precision(t.decisions.get("precision"), onnx_fp16)
            == _precision(o.decisions.get("precision"), False),
        }
        for kind, same in checks.items():
            if not same and _excused(kind, t, o) is None:
                problems.append(f"{kind} differs: torch {t.name}: {t.decisions.get(kind)} / "
                                f"ONNX {o.name}: {o.decisions.get(kind)}")
    assert pairs, f"{name}: no conv or weight GEMM found"
    return problems


@pytest.mark.parametrize("target", _TARGETS)
@pytest.mark.parametrize("name", [a.name for a in ARCHS])
def test_torch_and_onnx_decide_alike(name: str, target: str) -> None:
    problems = _compare(name, target)
    assert not problems, "\n".join(problems[:10])


def test_a_bf16_host_differs_only_where_ort_says_so() -> None:
    """On a CPU with native bf16 (here Sapphire Rapids' ISA stood in for the host's), torch
    runs GEMMs in bf16 and ONNX stays fp32 with ORT's stated reason; nothing else differs."""
    with host_isa("xeon-8480"):
        assert _compare("llama", "cpu") == []
