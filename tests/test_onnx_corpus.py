"""ONNX's own backend test models through ``graphopt.optimize(..., target="cpu")``.

The onnx package ships them (``onnx/backend/test/data/{pytorch-converted, pytorch-operator,
simple}``): a ``model.onnx``, mostly opset 6-12 with IR version 3, and ``test_data_set_0/``
with inputs and reference outputs. Every model ONNX Runtime itself reproduces must still match
its reference after graphopt upgrades (``frontends/onnx_upgrade.py``) and optimizes it. The
reference inputs go in as ``calibration``, the batches the accuracy guard runs: some models
need particular values (an ``Expand`` shape, sequence split sizes), as a user's data would be.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import graphopt

_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
_CASES = sorted(p for suite in ("pytorch-converted", "pytorch-operator", "simple")
                for p in (_DATA / suite).iterdir() if (p / "model.onnx").exists())


def _tensors(folder: Path, kind: str) -> list[np.ndarray]:
    return [numpy_helper.to_array(onnx.load_tensor(str(f)))
            for f in sorted(folder.glob(f"test_data_set_0/{kind}_*.pb"))]


def _run(model: onnx.ModelProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, inputs, strict=False)))


def _match(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return len(got) == len(want) and all(
        np.allclose(g, w, rtol=1e-3, atol=1e-4) for g, w in zip(got, want, strict=True))


def test_the_corpus_is_there() -> None:
    assert len(_CASES) >= 100, f"{_DATA}: {len(_CASES)} models"


@pytest.mark.parametrize("case", _CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_backend_model_matches_its_reference_after_optimize(case: Path) -> None:
    model = onnx.load(str(case / "model.onnx"))
    inputs, want = _tensors(case, "input"), _tensors(case, "output")
    try:
        reproduced = _match(_run(model, inputs), want)
    except Exception:  # noqa: BLE001 - ORT's own failure: nothing to hold graphopt to
        reproduced = False
    if not reproduced:
        pytest.skip("ONNX Runtime itself does not reproduce this model's reference")
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits][:len(inputs)]
    # exact rewrites only: an explicit fp32 turns auto INT8 off (lossy within the int8 budget,
    # it cannot meet the reference's 1e-3; the INT8 tests check it against its own budget)
    opt = graphopt.optimize(str(case / "model.onnx"), target="cpu", measure=False,
                            precision="fp32", calibration=[dict(zip(names, inputs, strict=True))])
    assert _match(_run(opt.onnx_model, inputs), want)


def test_a_model_that_needs_real_input_values_says_how_to_give_them() -> None:
    """``Expand`` reads its target shape from an int64 input: graphopt's 0/1 samples cannot
    run it, so the error names the made-up integer input and the calibration fix."""
    case = _DATA / "simple" / "test_expand_shape_model1"
    with pytest.raises(graphopt.GraphoptError) as err:
        graphopt.optimize(str(case / "model.onnx"), target="cpu", measure=False)
    assert "inputs graphopt generated" in err.value.problem
    assert "integer input" in err.value.problem and "--calibration" in (err.value.fix or "")
