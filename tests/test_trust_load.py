"""Issue 19: ``graphopt.load`` on files from anyone, and the module it returns.

Written as a user hits it: a crafted archive never runs code (nothing is unpickled, no name
in it becomes code), a file that claims huge sizes or hides a zip bomb costs no
memory, a model copy saved when nothing paid keeps its shape range, and a loaded module says
what input it expected. Every outcome of a damaged file is a module or a GraphoptError.
"""

from __future__ import annotations

import inspect
import io
import json
import pickle
import resource
import struct
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import graphopt
from tests.test_save_load import ConvNet, _convnet, _fresh


def _saved(path: Path) -> Path:
    """A small valid file, fp32 on this CPU (the same numbers on any host)."""
    opt = graphopt.optimize(_convnet(), torch.randn(2, 3, 8, 8), target="cpu",
                            precision="fp32", measure=False)
    return opt.save(path)


def _rewrite(good: Path, out: Path, edit: Callable[[str, bytes], bytes | None],
             add: dict[str, bytes] | None = None) -> Path:
    """A copy of ``good`` with each member's bytes passed through ``edit`` (None drops it)."""
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(out, "w") as dst:
        root = src.namelist()[0].split("/", 1)[0]
        for item in src.infolist():
            data = edit(item.filename, src.read(item))
            if data is not None:
                dst.writestr(item, data)
        for name, data in (add or {}).items():
            dst.writestr(f"{root}/{name}", data)
    return out


def _edit_json(suffix: str, change: Callable[[Any], None]) -> Callable[[str, bytes], bytes]:
    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith(suffix):
            return data
        value = json.loads(data)
        change(value)
        return json.dumps(value).encode()
    return edit


class _Payload:
    """Unpickling this creates ``marker``: proof that a loader ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def _torch_saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_load_never_unpickles_a_crafted_archive(tmp_path: Path) -> None:
    """graphopt's marker on archives its reader refuses (a pickled weight, an opaque pickled
    constant), and a torch.save file: each a GraphoptError, and no payload ever runs."""
    good = _saved(tmp_path / "good.pt2")
    marker = tmp_path / "payload_ran"

    def pickled_weight(cfg: dict[str, Any]) -> None:
        next(iter(cfg["config"].values()))["use_pickle"] = True

    first = next(n for n in zipfile.ZipFile(good).namelist() if n.endswith("weights/weight_0"))
    weight = _rewrite(good, tmp_path / "weight.pt2", lambda n, d: _torch_saved(
        _Payload(marker)) if n == first else _edit_json("model_weights_config.json",
                                                        pickled_weight)(n, d))

    def opaque(cfg: dict[str, Any]) -> None:
        cfg["config"]["evil"] = {"path_name": "opaque_obj_0", "is_param": False,
                                 "use_pickle": True, "tensor_meta": None}

    constant = _rewrite(good, tmp_path / "opaque.pt2",
                        _edit_json("model_constants_config.json", opaque),
                        {"data/constants/opaque_obj_0": pickle.dumps(_Payload(marker))})
    plain = tmp_path / "plain.pt2"
    torch.save({"w": _Payload(marker)}, plain)
    for path, said in ((weight, "pickled"), (constant, "pickled"), (plain, "torch.save")):
        with pytest.raises(graphopt.GraphoptError) as info:
            graphopt.load(path)
        assert not marker.exists(), path
        assert said in info.value.problem, info.value.problem
        assert "torch.export.load" in info.value.fix or "torch.load" in info.value.fix


def test_weight_names_in_a_file_never_become_code(tmp_path: Path) -> None:
    """A weight's name is written into the generated forward() (``getattr(self, "name")``): a
    crafted one that closes the string and calls ``open`` must never run."""
    good = _saved(tmp_path / "good.pt2")
    marker = tmp_path / "code_ran"
    where = list(str(marker).encode())  # no dot: torch splits weight names at dots
    crafted = f'_saved_w1")is None or open(bytes({where}),"w")or getattr(self,"_saved_w1'

    def rename(member: str, data: bytes) -> bytes:
        if not member.endswith(("models/model.json", "model_weights_config.json")):
            return data
        return data.replace(b'"_saved_w0"', json.dumps(crafted).encode())

    path = _rewrite(good, tmp_path / "crafted.pt2", rename)
    assert json.dumps(crafted).encode() in path.read_bytes()
    with pytest.raises(graphopt.GraphoptError) as info:
        graphopt.load(path)(torch.randn(2, 3, 8, 8))
    assert not marker.exists()
    assert "is not a plain identifier" in info.value.problem


def test_model_copy_saves_its_shape_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """When nothing pays on the host, optimize returns a copy of the model; saved and loaded
    (here and in a fresh process) it is exported over the range and checks it, as the graph."""
    import graphopt.backends.torch.pipeline as pipeline

    monkeypatch.setattr(pipeline, "_slower_than_original",
                        lambda *a: "measured slower (forced by the test)")
    m = _convnet()
    source = Path(inspect.getsourcefile(ConvNet)).read_bytes()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    batch = torch.export.Dim("batch", min=1, max=64)
    opt = graphopt.optimize(m, torch.randn(2, 3, 8, 8), target="cpu", measure=True,
                            dynamic_shapes=({0: batch},))
    assert isinstance(opt.module, ConvNet)  # the plain copy
    path = opt.save(tmp_path / "copy.pt2")
    calls = [(torch.randn(b, 3, 8, 8),) for b in (1, 8, 64, 100)]
    loaded = graphopt.load(path)
    fresh, facts = _fresh(path, calls, tmp_path)
    assert facts["range"] == "batch in [1, 64]"
    with torch.no_grad():
        for (x,), far in zip(calls[:3], fresh, strict=False):
            torch.testing.assert_close(loaded(x), m(x), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(far, m(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(graphopt.GraphoptError, match=r"batch in \[1, 64\]"):
        loaded(*calls[3])
    assert fresh[3].startswith("GraphoptError") and "100" in fresh[3]
    assert Path(inspect.getsourcefile(ConvNet)).read_bytes() == source
    assert all(torch.equal(v, state[k]) for k, v in m.state_dict().items())


_MEASURED = """
import json, resource, sys, torch, graphopt
import graphopt.backends.torch.saved, graphopt.backends.torch.pt2_reader
import graphopt.backends.torch.pipeline
graphopt.load(sys.argv[1])  # warm: what any load costs
outcomes = []
for path in sys.argv[2:]:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        graphopt.load(path)
        outcome = "loaded"
    except graphopt.GraphoptError as e:
        outcome = "GraphoptError: " + e.problem
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    outcomes.append({"outcome": outcome, "grew_mb": grew / 1024})
print(json.dumps(outcomes))
"""


def _measured(good: Path, paths: list[Path]) -> list[dict[str, Any]]:
    """Each path loaded in a fresh process: the outcome and how far its peak memory grew."""
    done = subprocess.run([sys.executable, "-c", _MEASURED, str(good), *map(str, paths)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_huge_weight_over_empty_or_short_payload(tmp_path: Path) -> None:
    """A file that declares a 1 GiB weight over no bytes (or 16) is refused before anything
    is allocated."""
    good = _saved(tmp_path / "good.pt2")

    def huge(cfg: dict[str, Any]) -> None:
        meta = next(iter(cfg["config"].values()))["tensor_meta"]
        meta["sizes"] = [{"as_int": 16384}, {"as_int": 16384}]
        meta["strides"] = [{"as_int": 16384}, {"as_int": 1}]

    paths = []
    for size in (0, 16):
        def edit(name: str, data: bytes, size: int = size) -> bytes:
            if name.endswith("weights/weight_0"):
                return data[:size]
            return _edit_json("model_weights_config.json", huge)(name, data)
        paths.append(_rewrite(good, tmp_path / f"huge_{size}.pt2", edit))
    for got in _measured(good, paths):
        assert got["outcome"].startswith("GraphoptError"), got
        assert "declares [16384, 16384]" in got["outcome"], got
        assert got["grew_mb"] < 500, got


def _zip(path: Path, members: list[tuple[str, bytes, int, int, int]]) -> None:
    """A zip written by hand: (name, stored bytes, method, crc, uncompressed size) each."""
    out, central = bytearray(), bytearray()
    for name, data, method, crc, size in members:
        n, offset = name.encode(), len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(data),
                           size, len(n), 0) + n + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0,
                               crc, len(data), size, len(n), 0, 0, 0, 0, 0, offset) + n
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members),
                                 len(central), len(out), 0)
    path.write_bytes(bytes(out))


def _bomb(mib: int) -> tuple[bytes, int]:
    """``mib`` MiB of zeros as raw deflate (about 1 KiB per MiB), and their CRC."""
    zeros = bytes(1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)  # byte-aligned, no back-references
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    return chunk * mib + b"\x03\x00", crc  # an empty final block ends the stream


def test_zip_bomb_in_an_unused_member(tmp_path: Path) -> None:
    """A 1 GiB run of zeros deflated into ~1 MiB, as an extra file graphopt does not use: the
    file loads, and the bomb is never decompressed."""
    good = _saved(tmp_path / "good.pt2")
    with zipfile.ZipFile(good) as z:
        members = [(i.filename, z.read(i), 0, i.CRC, i.file_size) for i in z.infolist()]
    root = members[0][0].split("/", 1)[0]
    data, crc = _bomb(1024)
    bombed = tmp_path / "bombed.pt2"
    _zip(bombed, [*members, (f"{root}/extra/junk", data, 8, crc, 1 << 30)])
    assert bombed.stat().st_size < 4 << 20
    (got,) = _measured(good, [bombed])
    assert got["outcome"] == "loaded" and got["grew_mb"] < 500, got
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(graphopt.load(bombed)(x), _convnet()(x), rtol=1e-5, atol=1e-5)


def test_loaded_module_says_what_input_it_expected(tmp_path: Path) -> None:
    """Wrong dtype, a numpy array, an unknown keyword: a GraphoptError naming what was
    expected; the model's own input name as a keyword gives the positional call's numbers."""
    loaded = graphopt.load(_saved(tmp_path / "m.pt2"))
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(x=x), loaded(x))
        torch.testing.assert_close(loaded(x=x), _convnet()(x), rtol=1e-5, atol=1e-5)
    cases = [((x.double(),), {}, "input 'x' is float64; the module was optimized for float32"),
             ((x.numpy(),), {}, "input 'x' is a numpy.ndarray, not a torch.Tensor"),
             ((), {"inputs": x}, "no input named 'inputs'; its inputs are ['x']"),
             ((x,), {"x": x}, "input 'x' given twice"),
             ((), {}, "takes 1 inputs, got 0")]
    for args, kwargs, problem in cases:
        with pytest.raises(graphopt.GraphoptError) as info:
            loaded(*args, **kwargs)
        assert problem in info.value.problem, info.value.problem
        assert info.value.fix


_GOOD: list[bytes] = []


def _good_bytes(tmp: Path) -> bytes:
    if not _GOOD:
        _GOOD.append(_saved(tmp / "good.pt2").read_bytes())
    return _GOOD[0]


@settings(max_examples=50, deadline=timedelta(seconds=10), database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
                      max_size=6),
       cut=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)))
def test_damaged_file_is_a_module_or_a_graphopt_error(tmp_path: Path,
                                                      flips: list[tuple[float, int]],
                                                      cut: float | None) -> None:
    """Random byte flips and cuts of a valid file: load returns a module or a GraphoptError,
    never another exception, in bounded time (the deadline) and memory."""
    data = bytearray(_good_bytes(tmp_path))
    for where, xor in flips:
        data[int(where * len(data))] ^= xor
    if cut is not None:
        data = data[:int(cut * len(data))]
    path = tmp_path / "damaged.pt2"
    path.write_bytes(bytes(data))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        module = graphopt.load(path)
    except graphopt.GraphoptError as e:
        assert e.fix, e
    else:
        assert isinstance(module, nn.Module)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500 * 1024


def test_the_good_file_for_the_property_loads(tmp_path: Path) -> None:
    """The property above starts from a file that loads and computes the model."""
    path = tmp_path / "good.pt2"
    path.write_bytes(_good_bytes(tmp_path))
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(graphopt.load(path)(x), _convnet()(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("member", ["graphopt_outputs.json", "graphopt_plan.json"])
def test_a_record_whose_bytes_fail_their_checksum_is_a_graphopt_error(tmp_path: Path,
                                                                      member: str) -> None:
    """A byte flipped inside one of graphopt's records (the zip's CRC no longer matches):
    load says the archive is damaged, never a raw error from the zip reader (found by the
    hypothesis test above on the output record)."""
    good = _saved(tmp_path / "good.pt2")
    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(f"extra/{member}"))
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    data[info.header_offset + 30 + name_len + extra_len + 2] ^= 0x55
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(bytes(data))
    with pytest.raises(graphopt.GraphoptError, match="damaged"):
        graphopt.load(bad)
