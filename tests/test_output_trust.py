"""Issue 30, items 4, 5, 6 and 9 (parts): outputs go only where the user asked, a report never
replaces the artifact, no temp file outlives a write, and a deploy folder read from disk is
checked (its session config bounded by this machine, its files named as what they are, its
device honoured).

Each test is written as the user hits it (the CLI or the Python API). A refused command is
checked on the files of the folder it ran in (hidden temp files included) and on the bytes of a
victim file that was there before.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.backends.onnx.session import host_cpus
from graphopt.cli.main import main
from graphopt.errors import GraphoptError
from graphopt.files.outputs import OutputSet

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning",
                                        "ignore::DeprecationWarning")

SPEC = """
import torch

def build():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
    return m.eval(), (torch.randn(2, 16),)
"""
VICTIM = b"the user's own bytes\n"


def _files(folder: Path) -> dict[str, bytes]:
    """Every file and folder under ``folder``, hidden temp files included -> its bytes."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(folder.rglob("*"))}


def _spec(tmp_path: Path) -> str:
    (tmp_path / "m.py").write_text(SPEC)
    return f"{tmp_path / 'm.py'}:build"


def _refused(argv: list[str], capsys, needle: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and needle in err, err
    return err


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if optimize runs: a bad path must be refused before the slow work."""
    import graphopt.api.optimized
    import graphopt.cli.optimize

    def ran(*a, **k):
        raise AssertionError("the optimize work ran before the output paths were checked")

    monkeypatch.setattr(graphopt.api.optimized, "optimize", ran)
    monkeypatch.setattr(graphopt.cli.optimize, "optimize", ran)  # the CLI's own binding


def _onnx_model(path: Path) -> Path:
    """x[2,8] @ W + b -> Relu."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return path


_SESSION = {"format": "graphopt-ort-session", "version": 1, "target": "cpu",
            "providers": [["CPUExecutionProvider", {}]],
            "graph_optimization_level": "ORT_ENABLE_ALL", "intra_op_num_threads": None,
            "reasons": {}}


def _onnx_folder(folder: Path, session: dict | None = None, record: dict | None = None) -> Path:
    """A deploy folder with the onnxruntime artifact, as ``-o DIR/`` writes it."""
    folder.mkdir()
    _onnx_model(folder / "model.onnx")
    (folder / "model.graphopt.json").write_text(json.dumps(session or _SESSION))
    (folder / "deploy.json").write_text(json.dumps(record or {
        "artifact": "onnxruntime", "file": "model.onnx", "session_config": "model.graphopt.json"}))
    return folder


# -- item 4: a report over the artifact ---------------------------------------------------------

@pytest.mark.parametrize("report", ["model.pt2", "model.onnx", "model.graphopt.json",
                                    "model.onnx.data", "deploy.json", "model.pt2/r.json"])
def test_a_report_on_a_deploy_folders_file_is_refused_before_the_work(tmp_path, capsys, no_work,
                                                                     report):
    """``-o out/ --json out/model.pt2`` exited 0 with the report in model.pt2 and a stray
    ``.model.pt2.*.tmp`` beside it."""
    spec = _spec(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_bytes(VICTIM)
    before = _files(tmp_path)
    err = _refused(["optimize", spec, "--target", "cpu", "-o", f"{out}/",
                    "--json", str(out / report)], capsys, str(out / report.split("/")[0]))
    assert "same file" in err or "is inside" in err
    assert _files(tmp_path) == before


def test_a_report_on_the_pt2_or_onnx_artifact_is_refused_before_the_work(tmp_path, capsys,
                                                                       no_work):
    spec = _spec(tmp_path)
    (tmp_path / "o.pt2").write_bytes(VICTIM)
    before = _files(tmp_path)
    _refused(["optimize", spec, "--target", "cpu", "-o", str(tmp_path / "o.pt2"),
              "--md", str(tmp_path / "o.pt2")], capsys, "same file")
    _refused(["optimize", spec, "--target", "cpu", "-o", str(tmp_path / "o.pt2"),
              "--md", str(tmp_path / "o.pt2" / "r.md")], capsys, "is inside the saved model")
    _refused(["optimize", spec, "--target", "cpu", "-o", str(tmp_path / "n.onnx"),
              "--html", str(tmp_path / "n.onnx" / "r.html")], capsys, "is inside the model")
    assert _files(tmp_path) == before


def test_one_target_claimed_twice_is_refused_at_the_claim(tmp_path):
    """The stray temp file's root: a report claimed on a path, then the artifact staged on the
    same path as if that claim were its own; the second temp file replaced the first in the
    set, which the commit then never renamed nor removed."""
    outputs = OutputSet()
    outputs.claim(tmp_path / "model.pt2", "report")
    with pytest.raises(GraphoptError, match="same file: the report"):
        outputs.hold(tmp_path / "model.pt2", "saved model")
    outputs.reserve(tmp_path / "d" / "model.onnx", "model")
    with pytest.raises(GraphoptError, match="same file: the model"):
        outputs.claim(tmp_path / "d" / "model.onnx", "report")
    assert outputs.hold(tmp_path / "d" / "model.onnx", "model") == tmp_path / "d" / "model.onnx"
    # the same path written twice in one set: refused, and neither temp file is left
    outputs.write(tmp_path / "r.json", "first")
    with pytest.raises(GraphoptError, match="same file"):
        outputs.write(tmp_path / "r.json", "second")
    assert _files(tmp_path) == {}


def test_a_failure_after_staging_leaves_no_temp_file(tmp_path, capsys, monkeypatch):
    """A step after the artifact was staged (the device split, a report) failed: its temp
    file stayed in the output folder."""
    import graphopt.cli.optimize

    def broken(*a, **k):
        raise GraphoptError("the split failed", "fix the devices")

    monkeypatch.setattr(graphopt.cli.optimize, "with_partition", broken)
    spec = _spec(tmp_path)
    (tmp_path / "o.pt2").write_bytes(VICTIM)
    before = _files(tmp_path)
    _refused(["optimize", spec, "--target", "cpu", "-o", str(tmp_path / "o.pt2")], capsys,
             "the split failed")
    assert _files(tmp_path) == before


# -- item 5: outputs where the user did not ask --------------------------------------------------

def test_an_empty_output_path_is_refused(tmp_path, capsys, monkeypatch, no_work):
    """``-o ""`` wrote model.pt2 and deploy.json into the current folder."""
    spec = _spec(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deploy.json").write_bytes(VICTIM)
    before = _files(tmp_path)
    _refused(["optimize", spec, "--target", "cpu", "-o", ""], capsys, "-o is empty")
    _refused(["optimize", spec, "--target", "cpu", "-o", "o.onnx", "--json", ""], capsys,
             "path is empty")
    _refused(["plan", spec, "--target", "cpu", "--md", ""], capsys, "path is empty")
    assert _files(tmp_path) == before


@pytest.mark.parametrize("name", ["x.onnx", "x.pt2"])
def test_an_existing_folder_named_like_a_file_is_an_error(tmp_path, capsys, no_work, name):
    """An existing folder ``x.onnx`` received a torch artifact and deploy.json."""
    spec = _spec(tmp_path)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "keep.txt").write_bytes(VICTIM)
    before = _files(tmp_path)
    err = _refused(["optimize", spec, "--target", "cpu", "-o", str(folder)], capsys,
                   "is an existing folder")
    assert f"-o {folder}/" in err  # the fix says how to ask for a deploy folder there
    assert _files(tmp_path) == before


def test_a_trailing_slash_makes_an_existing_folder_a_deploy_folder(tmp_path, capsys):
    spec = _spec(tmp_path)
    folder = tmp_path / "x.onnx"
    folder.mkdir()
    (folder / "keep.txt").write_bytes(VICTIM)
    assert main(["optimize", spec, "--target", "cpu", "-o", f"{folder}/"]) == 0, \
        capsys.readouterr()
    files = _files(tmp_path)
    assert files["x.onnx/keep.txt"] == VICTIM and "x.onnx/deploy.json" in files
    assert not [f for f in files if f.rsplit("/", 1)[-1].startswith(".")]  # no temp file
    assert graphopt.load(folder) is not None


def test_the_api_refuses_empty_paths(tmp_path, monkeypatch):
    """``save_deploy("")`` wrote into the current folder."""
    import torch

    monkeypatch.chdir(tmp_path)
    opt = graphopt.optimize(torch.nn.Linear(4, 4).eval(), torch.randn(2, 4), target="cpu",
                            measure=False)
    (tmp_path / "deploy.json").write_bytes(VICTIM)
    before = _files(tmp_path)
    for call in (lambda: opt.save_deploy(""), lambda: opt.save(""),
                 lambda: opt.save_report(json="")):
        with pytest.raises(GraphoptError, match="path is empty"):
            call()
    assert _files(tmp_path) == before


# -- item 6: a session config from a file, bounded by this machine -------------------------------

def test_a_thread_count_above_this_machines_cpus_is_lowered_with_a_warning(tmp_path, caplog):
    """``intra_op_num_threads: 4096`` was accepted: the load did not return in 100 s."""
    cpus = host_cpus()
    folder = _onnx_folder(tmp_path / "d", {**_SESSION, "intra_op_num_threads": cpus + 1})
    with caplog.at_level(logging.WARNING):
        session = graphopt.load(folder)
    assert session.get_session_options().intra_op_num_threads == cpus
    assert f"intra_op_num_threads {cpus + 1} is more than this machine's {cpus} CPUs" in \
        caplog.text and str(folder / "model.graphopt.json") in caplog.text


@pytest.mark.parametrize("field, value, needle", [
    ("intra_op_num_threads", 4096, "intra_op_num_threads is 4096"),
    ("intra_op_num_threads", True, "intra_op_num_threads is True"),
    ("inter_op_num_threads", 4, "field 'inter_op_num_threads' is not one graphopt reads"),
    ("version", 2, "version is 2"),
    ("version", "1", "version is '1'"),
    ("target", "x" * 500, "target is"),
    ("reasons", {"threads": 4}, "reasons is"),
    ("providers", [["rm -rf", {}]], "not an ONNX Runtime execution provider"),
    ("providers", [["CPUExecutionProvider", {}]] * 50, "not a list of at most"),
    ("graph_optimization_level", "ORT_ENABLE_EVERYTHING", "graph_optimization_level is"),
])
def test_every_session_config_field_is_checked(tmp_path, field, value, needle):
    folder = _onnx_folder(tmp_path / "d", {**_SESSION, field: value})
    with pytest.raises(GraphoptError, match="session config") as err:
        graphopt.load(folder)
    assert needle in err.value.problem and str(folder / "model.graphopt.json") in \
        err.value.problem


@pytest.mark.parametrize("field, value, needle", [
    ("file", "../../victim.pt2", "file is '../../victim.pt2'"),
    ("session_config", "/etc/passwd", "session_config is '/etc/passwd'"),
    ("measured", "yes", "measured is 'yes', not true or false"),
    ("original_s", -1, "original_s is -1"),
    ("speedup_vs_original", float("nan"), "speedup_vs_original is nan"),
    ("candidates", [{"artifact": "rm"}], "candidates is"),
    ("candidates", "all", "candidates is"),
    ("device", "cuda", "field 'device' is not one graphopt writes"),
])
def test_every_deploy_record_field_is_checked(tmp_path, field, value, needle):
    record = {"artifact": "onnxruntime", "file": "model.onnx", field: value}
    folder = _onnx_folder(tmp_path / "d", record=record)
    with pytest.raises(GraphoptError) as err:
        graphopt.load(folder)
    assert needle in err.value.problem and str(folder / "deploy.json") in err.value.problem


# -- item 9: the artifact is not a file; the device is not one ORT runs on -----------------------

def _replace_with(path: Path, kind: str) -> str:
    """Make ``path`` a ``kind`` of non-file; returns what the error must call it."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return "a named pipe (FIFO)"
    if kind == "folder":
        path.mkdir()
        return "a directory"
    if kind == "link":
        path.symlink_to(path.parent / "gone")
        return "a symbolic link to nothing"
    sock = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(path.parent)  # a socket's path is limited to ~100 bytes: bind it relative
    try:
        sock.bind(path.name)
    finally:
        os.chdir(cwd)
    sock.close()
    return "a socket"


def _load_in_time(folder: Path, **kw) -> BaseException | None:
    """graphopt.load(folder), which must return or raise within 60 s (opening a FIFO blocks)."""
    got: list[BaseException | None] = []

    def run() -> None:
        try:
            graphopt.load(folder, **kw)
            got.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            got.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert got, "graphopt.load blocked"
    return got[0]


@pytest.mark.parametrize("kind", ["fifo", "folder", "socket", "link"])
def test_an_onnx_artifact_that_is_not_a_file_is_named(tmp_path, kind):
    """A deploy folder whose model.onnx is a FIFO or a folder was said to not exist."""
    folder = _onnx_folder(tmp_path / "d")
    said = _replace_with(folder / "model.onnx", kind)
    err = _load_in_time(folder)
    assert isinstance(err, GraphoptError), err
    assert said in err.problem and "does not exist" not in err.problem, err.problem


@pytest.mark.parametrize("kind", ["fifo", "folder", "socket", "link"])
def test_a_pt2_artifact_that_is_not_a_file_is_named(tmp_path, kind):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "model.pt2").write_bytes(b"x")
    (folder / "deploy.json").write_text(json.dumps({"artifact": "torch", "file": "model.pt2"}))
    said = _replace_with(folder / "model.pt2", kind)
    err = _load_in_time(folder)
    assert isinstance(err, GraphoptError), err
    assert said in err.problem and str(folder / "model.pt2") in err.problem, err.problem


def test_a_dangling_deploy_record_link_is_named(tmp_path):
    folder = _onnx_folder(tmp_path / "d")
    _replace_with(folder / "deploy.json", "link")
    with pytest.raises(GraphoptError, match="deploy record .* is a symbolic link to nothing"):
        graphopt.load(folder)


def test_load_honours_the_device_of_an_onnx_folder(tmp_path, monkeypatch):
    """``graphopt.load(onnx_folder, device="xyz:abc")`` silently returned a CPU session."""
    import onnxruntime as ort

    folder = _onnx_folder(tmp_path / "d")
    assert graphopt.load(folder, device="cpu").get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(GraphoptError, match="'xyz:abc' is not a device"):
        graphopt.load(folder, device="xyz:abc")
    with pytest.raises(GraphoptError, match="'mps' is not one ONNX Runtime sessions run on"):
        graphopt.load(folder, device="mps")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(GraphoptError, match="this onnxruntime has none") as err:
            graphopt.load(folder, device="cuda")
        assert "onnxruntime-gpu" in err.value.fix
        # an ORT that lists CUDA but cannot start it: the session is refused, not run on CPU
        have = ort.get_available_providers()
        monkeypatch.setattr(ort, "get_available_providers",
                            lambda: ["CUDAExecutionProvider", *have])
        with pytest.raises(GraphoptError, match="could not start CUDAExecutionProvider"):
            graphopt.load(folder, device="cuda:0")
    else:  # a GPU machine: the session runs on CUDA
        assert graphopt.load(folder, device="cuda").get_providers()[0] == "CUDAExecutionProvider"
