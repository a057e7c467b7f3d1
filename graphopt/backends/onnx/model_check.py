"""The ONNX checker on a rewritten model: after each pass (a pass whose model fails it is
reverted alone) and on the result (shapes inferred into it, then ``full_check``).

A model past protobuf's 2 GB limit is checked through a temporary file with its weights as
external data.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
import onnx.checker
import onnx.shape_inference

from graphopt.backends.onnx.save import PROTO_LIMIT
from graphopt.errors import GraphoptError

__all__ = ["check", "finalize"]


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its shapes inferred (strict), after ``check_model(full_check=True)``."""
    if model.ByteSize() < PROTO_LIMIT:
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                  data_prop=True)
        onnx.checker.check_model(model, full_check=True)
        return model
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(model, str(path), save_as_external_data=True, location="model.data")
        onnx.shape_inference.infer_shapes_path(str(path), str(path), check_type=True,
                                               strict_mode=True, data_prop=True)
        onnx.checker.check_model(str(path), full_check=True)
        return onnx.load(str(path))


def check(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, str | None]:
    """(``model`` with its shapes inferred, None) when it passes the checker and strict shape
    inference, else (None, why)."""
    try:
        return _checked(model), None
    except Exception as e:  # noqa: BLE001 - the checker raises ValidationError, C++ errors...
        return None, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def finalize(model: onnx.ModelProto, checked: onnx.ModelProto | None = None
             ) -> onnx.ModelProto:
    """Shapes inferred into the model, then ``check_model(full_check=True)`` (``checked``:
    :func:`check`'s model for this very ``model``, not checked twice); a failure here is a
    graphopt bug (every pass was checked), reported as such."""
    if checked is not None:
        return checked
    try:
        return _checked(model)
    except Exception as e:
        raise GraphoptError(f"the optimized model fails the ONNX checker: {type(e).__name__}: "
                            f"{' '.join(str(e).split())[:300]}",
                            "report this graphopt bug with the model; pass precision='fp32', "
                            "quantize='none' to get a model without the rewrites") from None
