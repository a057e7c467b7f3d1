"""Issue 30, items 2 and 3: every tensor of a low-bit archive fits its bytes, and a damaged one
is refused by ``graphopt.load``, naming the tensor, never on the first call.

Written as an attacker hits it: a real saved archive per low-bit op (FP8, INT8 dynamic, INT8
weight-only and INT4 for an h100, INT8 for the CPU) with one tensor record edited: a scale
declared with zero strides over a 2-byte payload (the kernels ignore strides and read past
it), scales with permuted strides (another answer, no error), a short scale, an int4 group of
7, nibbles for a quarter of K, an fp8 weight in e5m2, a column-major weight, a CPU INT8 zero
point cut short. Then a property test draws sizes, strides, offsets and payload lengths for
every tensor of every op's archive: load refuses it with a GraphoptError, or the module gives
exactly what its contiguous twin (the same values stored row-major) gives; never a crash,
never bytes from outside the payload.

ATen's low-bit kernels do not check their arguments (one crashes the process), so every call
here runs first in a child process, as in ``test_quant_kernels``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import graphopt
from graphopt.backends.torch.pt2_graph import DTYPES

ROOT = Path(__file__).resolve().parents[1]
K, N = 64, 32
#: archive name -> the optimize options that put its op in the graph
OPTIONS = {
    "fp8": {"target": "h100", "quantize": "fp8"},
    "int4": {"target": "h100", "quantize": "int4"},
    "int8_dynamic": {"target": "h100", "quantize": "int8_dynamic"},
    "int8_weight_only": {"target": "h100", "quantize": "int8_weight_only"},
    "int8_cpu": {"target": "cpu", "precision": "fp32", "quantize": "int8"},
}


def x() -> torch.Tensor:
    return torch.randn(3, K, generator=torch.Generator().manual_seed(0))


@dataclass(frozen=True)
class Entry:
    """One tensor record of an archive: its name, file, dtype and layout."""

    fqn: str
    file: str
    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...]


def _member(z: zipfile.ZipFile, suffix: str) -> str:
    return next(n for n in z.namelist() if n.endswith(suffix))


def entries(path: Path) -> dict[str, Entry]:
    with zipfile.ZipFile(path) as z:
        config = json.loads(z.read(_member(z, "model_weights_config.json")))["config"]
    out = {}
    for fqn, p in config.items():
        meta = p["tensor_meta"]
        out[fqn] = Entry(fqn, p["path_name"], DTYPES[meta["dtype"]],
                         tuple(s["as_int"] for s in meta["sizes"]),
                         tuple(s["as_int"] for s in meta["strides"]))
    return out


def payload(path: Path, entry: Entry) -> torch.Tensor:
    """The flat tensor of an entry's file."""
    with zipfile.ZipFile(path) as z:
        raw = bytearray(z.read(_member(z, f"data/weights/{entry.file}")))
    return torch.frombuffer(raw, dtype=entry.dtype).clone() if raw else \
        torch.empty(0, dtype=entry.dtype)


def edited(path: Path, out: Path, fqn: str, sizes: Any = None, strides: Any = None,
           offset: int | None = None, dtype: int | None = None, data: bytes | None = None,
           program: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A copy of ``path`` with the record ``fqn`` (and its file's bytes, the program) edited."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        config_name = _member(src, "model_weights_config.json")
        config = json.loads(src.read(config_name))
        record = config["config"][fqn]
        meta = record["tensor_meta"]
        for key, value in (("sizes", sizes), ("strides", strides)):
            if value is not None:
                meta[key] = [{"as_int": int(v)} for v in value]
        if offset is not None:
            meta["storage_offset"] = {"as_int": offset}
        if dtype is not None:
            meta["dtype"] = dtype
        for item in src.infolist():
            body = src.read(item)
            if item.filename == config_name:
                body = json.dumps(config).encode()
            elif data is not None and item.filename.endswith(f"data/weights/{record['path_name']}"):
                body = data
            elif program is not None and item.filename.endswith("models/model.json"):
                value = json.loads(body)
                program(value)
                body = json.dumps(value).encode()
            dst.writestr(item, body)
    return out


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("low_bit")
    out = {}
    for name, options in OPTIONS.items():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(K, N)).eval()
        opt = graphopt.optimize(model, x(), measure=False, **options)
        out[name] = opt.save(folder / f"{name}.pt2")
    return out


# --- damaged archives ---------------------------------------------------------------------------
def _group(group: int) -> Callable[[dict[str, Any]], None]:
    def change(program: dict[str, Any]) -> None:
        for node in program["graph_module"]["graph"]["nodes"]:
            for i in node["inputs"]:
                if i["name"] == "group":
                    i["arg"] = {"as_int": group}
    return change


_W, _S = "_graphopt_q0_linear", "_graphopt_q1_linear"  # the quantize pass's weight and scale
#: case -> (archive, the tensor the error names, edit keywords for :func:`edited`)
DAMAGED: dict[str, tuple[str, str, dict[str, Any]]] = {
    "zero-stride scale over 2 bytes": ("int8_weight_only", _S, {
        "strides": [0], "data": bytes(2)}),
    "fp8 scale with zero strides": ("fp8", _S, {"strides": [0, 0], "data": bytes(4)}),
    "int4 scales with permuted strides": ("int4", _S, {"strides": [2 * N, 1, N]}),
    "short scale": ("int8_weight_only", _S, {"sizes": [N - 1]}),
    "short fp8 scale": ("fp8", _S, {"sizes": [N - 1, 1]}),
    "int4 group of 7": ("int4", _W, {"program": _group(7)}),
    "nibbles for a quarter of K": ("int4", _W, {"sizes": [N, K // 4], "strides": [K // 4, 1]}),
    "fp8 weight in e5m2": ("fp8", _W, {"dtype": 30}),
    "column-major weight": ("int8_dynamic", _W, {"strides": [1, N]}),
    "column-major fp8 weight": ("fp8", _W, {"strides": [1, N]}),
    "CPU INT8 zero point cut short": ("int8_cpu", "_graphopt_int8_0_zp", {"sizes": [N // 2]}),
    "CPU INT8 weight column-major": ("int8_cpu", "_graphopt_int8_0_w", {"strides": [1, N]}),
}


def damaged(archives: dict[str, Path], case: str, folder: Path) -> Path:
    name, fqn, edit = DAMAGED[case]
    return edited(archives[name], folder / "damaged.pt2", fqn, **edit)


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_low_bit_archive_is_refused_at_load(archives: dict[str, Path], case: str,
                                                      tmp_path: Path) -> None:
    path = damaged(archives, case, tmp_path)
    with pytest.raises(graphopt.GraphoptError) as info:
        graphopt.load(path)
    name = DAMAGED[case][1]
    assert f"the tensor {name} " in info.value.problem, info.value.problem
    assert "damaged" in info.value.problem and "Optimized.save" in info.value.fix


def test_each_archive_loads_and_runs_as_saved(archives: dict[str, Path]) -> None:
    """The undamaged twins of the cases above: each loads and gives finite outputs."""
    for name, path in archives.items():
        with torch.no_grad():
            y = graphopt.load(path)(x())
        assert y.shape == (3, N) and bool(torch.isfinite(y).all()), name


# --- any layout: refused, or the contiguous twin's answer ----------------------------------------
def _strides(draw: Any, sizes: list[int]) -> list[int]:
    contiguous, step = [], 1
    for n in reversed(sizes):
        contiguous.insert(0, step)
        step *= max(n, 1)
    kind = draw(st.sampled_from(["contiguous", "column-major", "zero", "random"]))
    if kind == "contiguous":
        return contiguous
    if kind == "column-major":
        out, step = [], 1
        for n in sizes:
            out.append(step)
            step *= max(n, 1)
        return out
    if kind == "zero":
        at = draw(st.integers(0, len(sizes) - 1))
        return [0 if i == at else s for i, s in enumerate(contiguous)]
    return [draw(st.integers(0, 2 * step)) for _ in sizes]


def _outcome(path: Path) -> Any:
    """What loading and calling ``path`` gives: the refusal at load, the error of the call,
    or the output."""
    try:
        module = graphopt.load(path)
    except graphopt.GraphoptError as e:
        return ("refused", e.problem)
    try:
        with torch.no_grad():
            return module(x())
    except (RuntimeError, graphopt.GraphoptError) as e:
        return ("call", str(e).split("\n")[0])


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=st.data())
def test_a_low_bit_tensor_fits_its_bytes_or_is_refused(archives: dict[str, Path],
                                                       tmp_path_factory: Any,
                                                       data: st.DataObject) -> None:
    folder = tmp_path_factory.mktemp("layout", numbered=True)
    name = data.draw(st.sampled_from(sorted(archives)), label="archive")
    entry = data.draw(st.sampled_from(sorted(entries(archives[name]).values(),
                                             key=lambda e: e.fqn)), label="tensor")
    sizes = list(entry.sizes) if data.draw(st.booleans(), label="same sizes") else \
        [data.draw(st.sampled_from(sorted({n, max(n - 1, 0), n + 1, 1}))) for n in entry.sizes]
    strides = _strides(data.draw, sizes)
    offset = data.draw(st.integers(0, 6), label="offset")
    reach = sum((n - 1) * s for n, s in zip(sizes, strides, strict=True) if n)
    need = offset if 0 in sizes else offset + 1 + reach
    count = max(need + data.draw(st.integers(-2, 3), label="payload - need"), 0)
    flat = payload(archives[name], entry)
    flat = flat.repeat(count // max(flat.numel(), 1) + 1)[:count].contiguous()
    crafted = edited(archives[name], folder / "crafted.pt2", entry.fqn, sizes, strides, offset,
                     data=_bytes(flat))
    got = _outcome(crafted)
    if count < need:  # the view would reach past its bytes
        assert isinstance(got, tuple) and got[0] == "refused", got
        return
    if isinstance(got, tuple) and got[0] == "refused":
        return
    twin = torch.as_strided(flat, sizes, strides, offset).contiguous()
    want = _outcome(edited(archives[name], folder / "twin.pt2", entry.fqn, sizes,
                           twin.stride(), 0, data=_bytes(twin)))
    if isinstance(got, tuple):
        assert got == want
    else:
        assert isinstance(want, torch.Tensor), want
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().view(-1).view(torch.uint8).numpy())


# --- every kernel call above, first in a child process -------------------------------------------
_EVERY_CALL = """
import json, sys
from pathlib import Path
import pytest
import tests.test_pt2_low_bit_trust as t
archives = {k: Path(v) for k, v in json.loads(sys.argv[1]).items()}
folder = Path(sys.argv[2])
t.test_each_archive_loads_and_runs_as_saved(archives)
for case in t.DAMAGED:
    t.test_a_damaged_low_bit_archive_is_refused_at_load(archives, case, folder)


class Factory:
    n = 0

    def mktemp(self, name, numbered=True):
        self.n += 1
        path = folder / f"{name}{self.n}"
        path.mkdir()
        return path


t.test_a_low_bit_tensor_fits_its_bytes_or_is_refused(archives, Factory())
print("DONE")
"""


@pytest.fixture(scope="module", autouse=True)
def _no_kernel_crashes_this_host(archives: dict[str, Path],
                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every test of this module, first in a child process: ATen's low-bit kernels trust
    their arguments (``_weight_int8pack_mm`` crashes the process on shapes it does not
    take), so on a host where a check here misses one, a crash fails these tests with its
    signal instead of ending the whole test run."""
    folder = tmp_path_factory.mktemp("child")
    done = subprocess.run([sys.executable, "-c", _EVERY_CALL,
                           json.dumps({k: str(v) for k, v in archives.items()}), str(folder)],
                          capture_output=True, text=True, cwd=ROOT, check=False, timeout=600)
    if done.returncode != 0 or not done.stdout.strip().endswith("DONE"):
        pytest.fail(f"a low-bit archive failed in a child process on this host (exit "
                    f"{done.returncode}): {done.stderr.strip()[-800:]}")
