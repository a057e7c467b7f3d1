"""Which ai.onnx opsets graphopt's export writes, and converting a model to exactly one.

graphopt reads opset 13 and newer (``frontends.onnx_safety.MIN_OPSET``); the installed torch
says how new each exporter goes (``torch.onnx._constants``). The TorchScript exporter writes
13 up to its maximum, the dynamo exporter 18 and newer (an older request comes back as 18, so
its model is converted down with ``onnx.version_converter``).
"""

from __future__ import annotations

from typing import Any

import onnx

from graphopt.errors import GraphoptError, first_line
from graphopt.frontends.onnx_safety import MIN_OPSET, default_opset

__all__ = ["DYNAMO_OPSET", "LEGACY_OPSET", "at_opset", "check_opset", "exporter_opsets",
           "supported_opsets"]

#: the TorchScript exporter's opset when none is asked for: 17 is the first with
#: LayerNormalization as one op
LEGACY_OPSET = 17
#: the dynamo exporter translates at opset 18 and newer (an older request comes back as 18)
DYNAMO_OPSET = 18


def exporter_opsets() -> dict[str, tuple[int, int]]:
    """The opsets each installed exporter writes, from torch's own constants."""
    try:
        from torch.onnx import _constants as c

        legacy_max = int(c.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET)
        dynamo_max = int(c.ONNX_MAX_OPSET)
    except (ImportError, AttributeError):  # pragma: no cover - older torch: its stated limits
        legacy_max, dynamo_max = 20, 23
    return {"TorchScript": (MIN_OPSET, legacy_max), "dynamo": (DYNAMO_OPSET, dynamo_max)}


def supported_opsets() -> tuple[int, int]:
    """The ai.onnx opsets :func:`export_torch` writes: graphopt reads opset 13 and newer
    (``frontends.onnx_safety``); the newest is the newest either installed exporter writes."""
    ranges = exporter_opsets().values()
    return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)


def check_opset(opset: Any) -> None:
    """None, or an int in :func:`supported_opsets`; anything else is a GraphoptError."""
    if opset is None:
        return
    lo, hi = supported_opsets()
    if isinstance(opset, bool) or not isinstance(opset, int) or not lo <= opset <= hi:
        detail = ", ".join(f"{k} {a}-{b}" for k, (a, b) in exporter_opsets().items())
        raise GraphoptError(f"ONNX opset {opset!r} is outside what the installed exporters "
                            f"write: {lo}-{hi} ({detail})",
                            f"pass opset= between {lo} and {hi}, or none: {LEGACY_OPSET} "
                            f"with the TorchScript exporter, {DYNAMO_OPSET} with dynamo")


def at_opset(proto: onnx.ModelProto, opset: int, failed: str) -> onnx.ModelProto:
    """``proto`` converted to exactly ``opset``: the dynamo exporter writes 18 and newer, and
    torch's own converter keeps the old opset silently when it cannot convert. ``failed``
    says what led here, for the error when the conversion fails."""
    written = default_opset(proto)
    if written == opset:
        return proto
    from onnx import version_converter

    try:
        return version_converter.convert_version(proto, opset)
    except Exception as e:  # the converter raises RuntimeError/ValueError per adapter
        raise GraphoptError(f"{failed}; and the "
                            f"dynamo exporter's opset-{written} model does not convert to "
                            f"opset {opset} ({first_line(e)})",
                            f"pass opset={written} (or another between {DYNAMO_OPSET} and "
                            f"{supported_opsets()[1]}), or make forward() exportable by "
                            "torch.onnx.export(dynamo=False)") from None
