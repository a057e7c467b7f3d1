"""ONNX frontend on model files: external data (loaded, run, never written back), external data
paths that escape the model's folder, and every bad input raising a ModelLoadError with a fix."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.errors import GraphoptError, ModelLoadError, UnsafePathError
from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.frontends.onnx_safety import default_opset
from tests.onnx_frontend_models import load, make, matmul_add, rng_array, vi

# ---------------------------------------------------------------- external data


def save_external(model: onnx.ModelProto, folder: Path) -> Path:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # save_model converts the model it is given to external data
    path = folder / "model.onnx"
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="w.bin", size_threshold=0)
    return path


def test_external_data_loads_weights_and_runs(tmp_path: Path) -> None:
    m = matmul_add()
    path = save_external(m, tmp_path)
    files = {p: p.read_bytes() for p in (path, tmp_path / "w.bin")}
    g = load_onnx(path)
    assert all(p.read_bytes() == data for p, data in files.items())
    assert not any(t.external_data for t in g.source_model.graph.initializer)
    loaded = {t.name: numpy_helper.to_array(t) for t in g.source_model.graph.initializer}
    for t in m.graph.initializer:
        np.testing.assert_array_equal(loaded[t.name], numpy_helper.to_array(t))
    assert g.tensors["W"].kind == "param" and g.name == "g"
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(g.source_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    x = rng_array(3, 4)
    (y,) = sess.run(None, {"X": x})
    np.testing.assert_allclose(y, x @ loaded["W"] + loaded["B"], rtol=1e-5, atol=1e-6)


def test_external_data_of_an_in_memory_model(tmp_path: Path) -> None:
    path = save_external(matmul_add(), tmp_path)
    lazy = onnx.load(str(path), load_external_data=False)
    g = load(lazy)
    assert any("external data not loaded" in w for w in g.warnings)
    assert g.tensors["W"].shape == (4, 8)
    g2 = load_onnx(lazy, base_dir=tmp_path)
    assert numpy_helper.to_array(g2.source_model.graph.initializer[0]).shape == (4, 8)


def external_model(folder: Path, locations: list[str]) -> Path:
    """A model whose initializers point at ``locations`` (written by hand, no data check)."""
    m = matmul_add()
    for t, loc in zip(m.graph.initializer, locations, strict=False):
        nbytes = len(t.raw_data)
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", loc), ("offset", "0"), ("length", str(nbytes))):
            t.external_data.add(key=key, value=value)
    path = folder / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_outside_the_folder_is_refused(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 1024)
    with pytest.raises(UnsafePathError) as err:
        load_onnx(external_model(folder, [location]))
    assert err.value.fix


def test_external_data_symlink_escape_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 1024)
    os.symlink(tmp_path / "secret.bin", folder / "w.bin")
    with pytest.raises(UnsafePathError):
        load_onnx(external_model(folder, ["w.bin"]))


def test_unsafe_location_is_refused_before_any_missing_file(tmp_path: Path) -> None:
    # The first tensor's file is missing, the second escapes: the escape must be reported.
    with pytest.raises(UnsafePathError):
        load_onnx(external_model(tmp_path, ["missing.bin", "../x.bin"]))


# ---------------------------------------------------------------- bad input


def _valid_file(tmp_path: Path) -> Path:
    path = tmp_path / "ok.onnx"
    onnx.save_model(matmul_add(), str(path))
    return path


def _truncated(tmp_path: Path) -> Path:
    data = _valid_file(tmp_path).read_bytes()
    path = tmp_path / "half.onnx"
    path.write_bytes(data[: len(data) // 2])
    return path


def _random_bytes(seed: int) -> Callable[[Path], Path]:
    def build(tmp_path: Path) -> Path:
        path = tmp_path / f"random{seed}.onnx"
        path.write_bytes(np.random.default_rng(seed).bytes(4096))
        return path
    return build


def _written(model: onnx.ModelProto, name: str = "m.onnx") -> Callable[[Path], Path]:
    def build(tmp_path: Path) -> Path:
        path = tmp_path / name
        path.write_bytes(model.SerializeToString())
        return path
    return build


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.onnx"
    path.touch()
    return path


def _parses_but_empty(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.onnx"
    path.write_bytes(b"\x08\x07")  # a valid ModelProto (ir_version=7) with no graph
    return path


def _zip(tmp_path: Path) -> Path:
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    return path


_OPSET11 = make([helper.make_node("Relu", ["X"], ["Y"])], [vi("X", [4])], [vi("Y", [4])],
                opset=11)
_DANGLING = make([helper.make_node("Relu", ["nowhere"], ["Y"])], [vi("X", [4])], [vi("Y", [4])])
_NO_PRODUCER = make([helper.make_node("Relu", ["X"], ["Y"])], [vi("X", [4])], [vi("Z", [4])])
_CYCLE = make([helper.make_node("Add", ["X", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
              [vi("X", [4])], [vi("b", [4])])
_TWICE = make([helper.make_node("Relu", ["X"], ["Y"]), helper.make_node("Neg", ["X"], ["Y"])],
              [vi("X", [4])], [vi("Y", [4])])
_NO_OPSET = matmul_add()
del _NO_OPSET.opset_import[:]

BAD_INPUTS: dict[str, Callable[[Path], Path]] = {
    "missing": lambda tmp: tmp / "nope.onnx",
    "directory": lambda tmp: tmp,
    "empty": _empty,
    "truncated": _truncated,
    "random0": _random_bytes(0),
    "random1": _random_bytes(1),
    "random2": _random_bytes(2),
    "zip": _zip,
    "parses-but-empty": _parses_but_empty,
    "dangling": _written(_DANGLING),
    "no-producer": _written(_NO_PRODUCER),
    "cycle": _written(_CYCLE),
    "written-twice": _written(_TWICE),
    "no-opset": _written(_NO_OPSET),
    "external-missing": lambda tmp: external_model(tmp, ["w.bin", "w.bin"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_a_graphopt_error_with_a_fix(tmp_path: Path, case: str) -> None:
    with pytest.raises(GraphoptError) as err:
        load_onnx(BAD_INPUTS[case](tmp_path))
    assert isinstance(err.value, ModelLoadError)
    assert err.value.problem and err.value.fix
    assert err.value.__traceback__ is not None


def test_old_opset_is_upgraded_and_says_so() -> None:
    graph = load_onnx(_OPSET11)
    assert [n.op_type for n in graph.nodes] == ["Relu"]
    assert any("opset 11 upgraded to 13" in w for w in graph.warnings), graph.warnings
    assert default_opset(graph.source_model) == 13
    assert default_opset(_OPSET11) == 11  # the caller's model is not changed


def test_a_failed_upgrade_names_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx.version_converter

    def refuse(model: object, version: int) -> None:
        raise RuntimeError("No Adapter For Relu from opset 11 to 12")

    monkeypatch.setattr(onnx.version_converter, "convert_version", refuse)
    with pytest.raises(ModelLoadError) as err:
        load_onnx(_OPSET11)
    assert "opset 11" in err.value.problem and "op Relu has no adapter" in err.value.problem
    assert "opset_version" in (err.value.fix or "")


def test_wrong_type_is_a_model_load_error() -> None:
    with pytest.raises(ModelLoadError) as err:
        load_onnx(42)  # type: ignore[arg-type]
    assert err.value.fix


def test_external_data_too_short(tmp_path: Path) -> None:
    path = external_model(tmp_path, ["w.bin", "w.bin"])
    (tmp_path / "w.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ModelLoadError, match="too short") as err:
        load_onnx(path)
    assert err.value.fix
