"""``graphopt lint``: the tensor-core compliance issues of a model, each with graphopt's fix.

Rules (from NVIDIA's tensor-core performance guides; the multiple depends on the dtype the
target would run: 8 for fp16/bf16, 4 for tf32, 16 for int8/fp8):

* TC001 conv channels / linear features not a multiple of the tensor-core requirement
* TC002 attention head_dim not a multiple of it
* TC003 GEMM rows (batch x sequence, or conv batch) not a multiple of 8
* TC004 fp32 GEMMs and convs on a GPU with TF32/bf16 tensor cores that they do not use
* TC005 convolutions in NCHW, where tensor cores (and oneDNN) prefer channels_last

The fix of TC001 and TC005 is the one ``optimize`` makes: the plan's dry run of the padding and
layout deciders (``decisions/rewrites.py``), applied or declined with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphopt.analysis.kernel_class import KernelClass
from graphopt.cost.roofline import peak_key, tc_alignment
from graphopt.decisions.precision.format import choose_precision
from graphopt.ir.plan import Plan

__all__ = ["LintIssue", "lint"]

_GEMMS = (KernelClass.GEMM, KernelClass.CONV)


@dataclass(frozen=True)
class LintIssue:
    node: str
    rule: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rule": self.rule, "message": self.message, "fix": self.fix}


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def lint(plan: Plan, precision: str = "auto") -> list[LintIssue]:
    """Issues of every GEMM-like node of ``plan`` for its target, in graph order."""
    target = plan.target
    dtype, _ = choose_precision(target, precision)
    multiple = tc_alignment(peak_key(dtype)) if target.is_gpu and dtype != "fp32" else None
    tf32_gpu = target.is_gpu and "tf32" in target.peak_flops  # sm_80+
    issues: list[LintIssue] = []
    for n in plan.nodes:
        a = n.analysis
        if a.no_work:  # zero-size: no kernel runs, so no tensor-core issue
            continue
        d = a.dims
        kc = a.kernel_class
        if kc is KernelClass.CONV and multiple:
            g = max(1, d.get("groups", 1))
            cin, cout = d.get("C_in", 0), d.get("C_out", 0)
            bad = [(k, v) for k, v in (("in", cin // g), ("out", cout // g)) if v % multiple]
            if bad and not (g > 1 and cin == g):
                issues.append(LintIssue(
                    n.name, "TC001", f"conv channels {cin}->{cout} (groups={g}): "
                    f"{', '.join(f'{k} {v}' for k, v in bad)} not a multiple of {multiple}",
                    _decided(n, "padding") or
                    f"pad to {_up(cin // g, multiple) * g}->{_up(cout // g, multiple) * g} "
                    "(graphopt optimize, pad=auto)"))
        elif kc is KernelClass.GEMM and multiple:
            bad = [(k, d.get(k, 0)) for k in ("K", "N") if d.get(k, 0) % multiple]
            if bad:
                issues.append(LintIssue(
                    n.name, "TC001", f"GEMM {d.get('K')}->{d.get('N')} features: "
                    f"{', '.join(f'{k}={v}' for k, v in bad)} not a multiple of {multiple}",
                    _decided(n, "padding") or
                    f"pad to {_up(d.get('K', 0), multiple)}->{_up(d.get('N', 0), multiple)} "
                    "(graphopt optimize, pad=auto)"))
        if kc is KernelClass.ATTENTION and multiple and d.get("head_dim", 0) % multiple \
                and n.op_type in ("Attention", "Softmax"):
            hd = d["head_dim"]
            issues.append(LintIssue(n.name, "TC002", f"attention head_dim {hd} is not a "
                                    f"multiple of {multiple}",
                                    f"pad head_dim to {_up(hd, multiple)} with the softmax "
                                    "scale kept at 1/sqrt(d) (graphopt optimize, pad=auto)"))
        if kc in _GEMMS and target.is_gpu:
            rows = d.get("batch", 1) if kc is KernelClass.CONV else d.get("M", 0)
            if rows % 8:
                what = "batch" if kc is KernelClass.CONV else "rows (batch x sequence)"
                issues.append(LintIssue(n.name, "TC003", f"{what} = {rows} is not a multiple "
                                        "of 8", "use a batch size that makes it a multiple of 8"
                                        " (graphopt does not pad the batch)"))
            if a.dtype == "fp32" and target.has("tensor_cores"):
                uses = ("conv relies on cuDNN's TF32 default (allow_tf32)"
                        if kc is KernelClass.CONV and tf32_gpu else "runs on CUDA cores")
                issues.append(LintIssue(n.name, "TC004", f"fp32 {kc.value} {uses}",
                                        "precision=auto (bf16 on sm_80+, fp16 before)"
                                        + (" or tf32" if tf32_gpu else "")))
        if kc is KernelClass.CONV:
            fix = ("layout=channels_last (graphopt optimize decides per region)"
                   if plan.model.source == "torch"
                   else "run with ONNX Runtime's NHWC preference (prefer_nhwc)")
            issues.append(LintIssue(n.name, "TC005", "convolution in NCHW layout",
                                    _decided(n, "layout") or fix))
    return issues


def _decided(n: Any, kind: str) -> str | None:
    """The fix ``optimize`` itself makes for this node (the plan's dry run of its padding and
    layout deciders), or why it declines: lint never has a rule of its own beside theirs."""
    d = n.decisions.get(kind)
    if d is None:
        return None
    if d.applied:
        return f"graphopt optimize applies it (pad=auto, layout=auto): {d.reason}"
    return f"graphopt optimize declines it: {d.reason.removeprefix('not applied: ')}"
