"""The ONNX checker on a rewritten model: after each pass (a pass whose model fails it is
reverted alone) and on the result (shapes inferred into it, then ``full_check``).

The checker and shape inference serialize the whole model and parse it back, weights and all:
3.2 s on a 300 MB Llama export, where they read only the weights' types and dims. So they run
on the model's light copy (``files.ort_load.split_weights``: each large weight an external
stub of the same dims and type, its bytes' size checked against them), with the stubs pointing
at a sparse file of the right length (the checker opens what a stub names): 0.22 s, the same
shapes inferred. The inferred shapes are then written into the model itself (always
graphopt's own: the frontend copies the user's), not into a copy of its weights.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
import onnx.checker
import onnx.shape_inference

from graphopt.backends.onnx.save import PROTO_LIMIT
from graphopt.errors import GraphoptError
from graphopt.files.ort_load import IN_MEMORY_LOCATION, split_weights

__all__ = ["check", "finalize"]


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its shapes inferred (strict), after ``check_model(full_check=True)``:
    the light copy checked (module doc), its shapes written into ``model``."""
    light, arrays = split_weights(model)
    if light.ByteSize() >= PROTO_LIMIT:
        raise GraphoptError(f"the model's graph and small tensors alone are past protobuf's "
                            f"2 GB limit ({light.ByteSize()} bytes)",
                            "keep large constants as initializers of 64 KB or more")
    inferred = onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=True,
                                                 data_prop=True)
    with tempfile.TemporaryDirectory() as tmp:
        with open(Path(tmp) / IN_MEMORY_LOCATION, "wb") as f:  # sparse: no bytes written
            f.truncate(max((a.nbytes for a in arrays.values()), default=0))
        path = Path(tmp) / "model.onnx"
        path.write_bytes(inferred.SerializeToString())
        onnx.checker.check_model(str(path), full_check=True)
    if light is model:  # nothing was split: the inferred copy is the model
        return inferred
    for field in ("value_info", "output"):
        del getattr(model.graph, field)[:]
        getattr(model.graph, field).extend(getattr(inferred.graph, field))
    return model


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
