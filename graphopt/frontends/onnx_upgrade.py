"""Old ONNX, read as new: models below opset 13 are upgraded with ``onnx.version_converter``.

Much published ONNX (the model zoo's classic CNNs, older exports, ONNX's own backend test
models) is opset 6-12. graphopt's rules read opset 13 semantics (Softmax over the last axis,
Squeeze/Unsqueeze/Reduce axes as inputs), so such a model is converted to opset 13 once, on
graphopt's own copy, and the plan's warnings say so. Graphs of IR version < 4 list every
initializer among the graph inputs (it was required then); after the conversion those entries
are dropped and the IR version raised to 7 (opset 13's), so the weights count as the constants
they are.
"""

from __future__ import annotations

import re

import onnx
import onnx.version_converter

from graphopt.errors import ModelLoadError, first_line
from graphopt.frontends.onnx_safety import MIN_OPSET, default_opset

__all__ = ["TARGET_OPSET", "upgrade"]

#: the opset old models are converted to: the oldest graphopt's rules read
TARGET_OPSET = MIN_OPSET
#: the IR version ONNX pairs with opset 13 (onnx.helper.VERSION_TABLE)
_OPSET_IR = 7


def _drop_initializer_inputs(model: onnx.ModelProto) -> None:
    """IR < 4 graphs list initializers as inputs; keep only the real inputs."""
    inits = {t.name for t in model.graph.initializer}
    keep = [i for i in model.graph.input if i.name not in inits]
    if len(keep) < len(model.graph.input):
        del model.graph.input[:]
        model.graph.input.extend(keep)


def _failed_op(message: str, model: onnx.ModelProto) -> str | None:
    """The op a version_converter error names, if it names one the model uses."""
    ops = {n.op_type for n in model.graph.node}
    named = [w for w in re.findall(r"[A-Z][A-Za-z0-9]+", message) if w in ops]
    return named[0] if named else None


def upgrade(model: onnx.ModelProto, warnings: list[str]) -> onnx.ModelProto:
    """``model`` at opset >= 13 (converted if older), initializers not listed as inputs."""
    opset = default_opset(model)
    if opset is None or opset >= TARGET_OPSET:
        return model
    try:
        new = onnx.version_converter.convert_version(model, TARGET_OPSET)
    except Exception as exc:  # the converter raises RuntimeError/ConvertError with the op
        op = _failed_op(str(exc), model)
        raise ModelLoadError(
            f"the model is ai.onnx opset {opset} and onnx.version_converter could not upgrade "
            f"it to {TARGET_OPSET}" + (f": op {op} has no adapter" if op else "")
            + f" ({first_line(exc)})",
            fix="re-export the model at opset 13 or newer (e.g. torch.onnx.export(..., "
                "opset_version=17))") from None
    _drop_initializer_inputs(new)
    new.ir_version = max(new.ir_version, _OPSET_IR)  # IR 4+: initializers need not be inputs
    warnings.append(f"ai.onnx opset {opset} upgraded to {TARGET_OPSET} with "
                    "onnx.version_converter; the plan and any optimized model are opset "
                    f"{TARGET_OPSET}")
    return new
