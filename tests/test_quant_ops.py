"""The quantized Linear ops (``backends/torch/quant_ops.py``): each op against the fp32 Linear
with its real kernel on this CPU, through torch.export save and load (in this process and in
another), int4's saved form and back bit-exact, and the CUDA path under FakeTensorMode, where
torch's meta kernels check the shapes and layouts a GPU would take, and the ops' fakes refuse
tensors left on another device.

Error bounds as in ``test_quant_kernels`` (about twice what was measured); W8A8 measured
0.007-0.008 of the output's scale, cosine 0.99996, so (0.02, 0.9998).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from graphopt.backends.torch import quant_kernels as qk
from graphopt.backends.torch.quant_ops import (
    INT4_LINEAR,
    INT4_LINEAR_SAVED,
    QUANT_OPS,
    int4_from_saved,
    int4_to_saved,
    move_quantized,
    pack_linear,
)

ROOT = Path(__file__).resolve().parents[1]
#: kernel -> (max error over the output's scale, cosine floor)
BOUNDS = {"fp8_e4m3": (0.06, 0.999), "int8_dynamic": (0.02, 0.9998),
          "int8_weight_only": (0.015, 0.9999), "int4_weight_only": (0.10, 0.997)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LEADS = {"1d": (), "2d": (5,), "3d": (2, 3)}
K, N, GROUP = 256, 128, 32  # legal for every kernel: K % 32 (int8 bf16), N % 16, K / GROUP whole


def linear(lead: tuple[int, ...] = (2, 3), seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*lead, K, generator=g), torch.randn(N, K, generator=g) / K ** 0.5,
            torch.randn(N, generator=g))


def call(kernel: str, x: torch.Tensor, tensors: tuple[torch.Tensor, ...],
         bias: torch.Tensor | None) -> torch.Tensor:
    group = (GROUP,) if kernel == "int4_weight_only" else ()
    return QUANT_OPS[kernel](x, *tensors, *group, bias)


def error(ref: torch.Tensor, out: torch.Tensor) -> tuple[float, float]:
    r, o = ref.double().flatten(), out.double().flatten()
    return float((r - o).abs().max() / r.abs().max()), float(r @ o / (r.norm() * o.norm()))


_EVERY_CALL = """
import torch
import tests.test_quant_ops as t
for kernel in t.BOUNDS:
    for act in t.DTYPES.values():
        x, w, b = t.linear()
        t.call(kernel, x.to(act), t.pack_linear(kernel, w, act, t.GROUP), b)
"""


@pytest.fixture(scope="module", autouse=True)
def _no_kernel_crashes_this_host() -> None:
    """Every kernel on the test shapes, first in a child process: ``_weight_int8pack_mm``
    crashes the process on shapes it does not take (measured on one AVX512-BF16 host), so on
    another CPU a crash fails these tests instead of ending the run."""
    done = subprocess.run([sys.executable, "-c", _EVERY_CALL], capture_output=True, text=True,
                          cwd=ROOT, check=False, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"a low-bit kernel failed in a child process on this host (exit "
                    f"{done.returncode}): {done.stderr.strip()[-500:]}")


# --- each op against fp32 -----------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("lead", LEADS)
@pytest.mark.parametrize("act", DTYPES)
@pytest.mark.parametrize("kernel", BOUNDS)
def test_each_op_runs_its_real_kernel_within_its_bound(kernel: str, act: str, lead: str,
                                                       bias: bool) -> None:
    x, w, b = linear(LEADS[lead])
    b = b if bias else None
    ref = torch.nn.functional.linear(x, w, b)
    out = call(kernel, x.to(DTYPES[act]), pack_linear(kernel, w, DTYPES[act], GROUP), b)
    assert out.shape == ref.shape and out.dtype == DTYPES[act]
    err, cos = error(ref, out.float())
    limit, floor = BOUNDS[kernel]
    bf16 = 2 ** -8 if act == "bf16" else 0.0  # the activations' own rounding
    assert 0 < err <= limit + 4 * bf16 and cos >= floor - bf16, (err, cos)


@pytest.mark.parametrize("kernel, k, n, act, why", [
    ("int8_weight_only", 250, 128, torch.bfloat16, "crashes on bf16"),
    ("fp8_e4m3", 256, 120, torch.float32, "multiples of 16"),
    ("int4_weight_only", 96, 128, torch.float32, "does not split into groups"),
    ("nvfp4", 256, 128, torch.float32, "no torch kernel"),
])
def test_pack_linear_refuses_what_a_kernel_cannot_take(kernel: str, k: int, n: int,
                                                       act: torch.dtype, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        pack_linear(kernel, torch.randn(n, k), act, 64)


# --- int4: the nibbles form ----------------------------------------------------------------------
@pytest.mark.parametrize("n, k", [(16, 32), (48, 64), (64, 256), (80, 128), (128, 512)])
def test_a_cpu_int4_pack_reads_back_to_its_nibbles(n: int, k: int) -> None:
    """Whole and partial row blocks (BLOCK_N is 64 rows on AVX512, 32 on AVX2)."""
    q = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(n + k))
    nibbles = qk.int4_nibbles(q)
    assert torch.equal(qk._q_of_nibbles(nibbles), q.to(torch.uint8))
    assert torch.equal(nibbles[:, 0] >> 4, q[:, 0].to(torch.uint8))  # q[n, 0]: high nibble
    packed = qk.int4_pack(nibbles)
    assert torch.equal(packed, torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
    assert torch.equal(qk.int4_unpack(packed), nibbles)


def test_int4_saved_op_equals_the_packed_op() -> None:
    x, w, b = linear()
    q, scales_zeros = qk.quantize_int4(w, GROUP)
    nibbles = qk.int4_nibbles(q)
    assert torch.equal(INT4_LINEAR_SAVED(x, nibbles, scales_zeros, GROUP, b),
                       INT4_LINEAR(x, qk.int4_pack(nibbles), scales_zeros, GROUP, b))


def test_an_unknown_int4_layout_is_refused() -> None:
    with pytest.raises(RuntimeError, match="neither a CPU pack"):
        qk.int4_unpack(torch.zeros(8, 4, dtype=torch.int32))


def test_a_pack_that_is_no_permutation_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "_convert_weight_to_int4pack_for_cpu",
                        lambda q, tiles: torch.zeros(q.shape[0], q.shape[1] // 2,
                                                     dtype=torch.uint8))
    qk._cpu_int4_order.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="not a permutation"):
            qk._cpu_int4_order(16, 64)
    finally:
        qk._cpu_int4_order.cache_clear()


# --- a GraphModule over buffers ------------------------------------------------------------------
class Quantized(torch.nn.Module):
    """Every op on one input, each over its own buffers, the int4 weight read twice."""

    def __init__(self, act: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.kernels = list(BOUNDS)
        for i, kernel in enumerate(self.kernels):
            _, w, b = linear(seed=i + 1)
            for j, t in enumerate(pack_linear(kernel, w, act, GROUP)):
                self.register_buffer(f"q{i}_{j}", t)
            self.register_buffer(f"b{i}", b if i % 2 == 0 else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for i, kernel in enumerate(self.kernels):
            tensors = tuple(getattr(self, f"q{i}_{j}") for j in range(2))
            outs.append(call(kernel, x, tensors, getattr(self, f"b{i}")))
        outs.append(call("int4_weight_only", x, (self.q3_0, self.q3_1), None))  # shared weight
        return torch.cat(outs, dim=-1)


def quantized_gm() -> fx.GraphModule:
    return fx.symbolic_trace(Quantized())


def ops_of(gm: fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"
            and n.target in (*QUANT_OPS.values(), INT4_LINEAR_SAVED)]


def test_int4_to_saved_and_back_is_bit_exact() -> None:
    gm = quantized_gm()
    x = linear()[0]
    before, packed = gm(x), gm.q3_0.clone()
    assert int4_to_saved(gm) == 2 and ops_of(gm).count(INT4_LINEAR_SAVED) == 2
    q, _ = qk.quantize_int4(linear(seed=4)[1], GROUP)
    assert torch.equal(gm.q3_0, qk.int4_nibbles(q))  # the shared buffer converted once
    assert torch.equal(gm(x), before)
    assert int4_from_saved(gm) == 2 and INT4_LINEAR_SAVED not in ops_of(gm)
    assert torch.equal(gm.q3_0, packed) and torch.equal(gm(x), before)
    assert int4_from_saved(gm) == 0  # nothing left in the saved form


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    """(.pt2 of the module with int4 in its saved form, an input, the eager output)."""
    gm = quantized_gm()
    x = linear()[0]
    expected = gm(x)
    int4_to_saved(gm)
    path = tmp_path_factory.mktemp("quant_ops") / "quantized.pt2"
    torch.export.save(torch.export.export(gm, (x,)), path)
    return path, x, expected


def test_export_save_load_gives_the_same_outputs(archive) -> None:
    path, x, expected = archive
    loaded = torch.export.load(path).module()
    assert torch.equal(loaded(x), expected)
    assert int4_from_saved(loaded) == 2 and INT4_LINEAR_SAVED not in ops_of(loaded)
    assert torch.equal(loaded(x), expected)


_LOAD = """
import sys
import torch
import graphopt.backends.torch.quant_ops as ops
path, x_path = sys.argv[1:]
x, expected = torch.load(x_path)
loaded = torch.export.load(path).module()
assert torch.equal(loaded(x), expected), "saved form"
assert ops.int4_from_saved(loaded) == 2
assert torch.equal(loaded(x), expected), "packed here"
"""


def test_the_archive_loads_in_another_process(archive, tmp_path: Path) -> None:
    """A fresh process: its own CPU int4 layout, the ops registered by the import only."""
    path, x, expected = archive
    torch.save((x, expected), tmp_path / "io.pt")
    done = subprocess.run([sys.executable, "-c", _LOAD, str(path), str(tmp_path / "io.pt")],
                          capture_output=True, text=True, cwd=ROOT, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-1000:]


def test_move_quantized_keeps_the_quantized_dtypes() -> None:
    """``.to(bf16)`` casts the bias and leaves the e4m3 weight and fp32 scales alone."""
    gm = quantized_gm()
    x = linear()[0]
    expected = gm(x)
    move_quantized(gm, lambda: gm._apply(lambda t: t.to(torch.bfloat16)
                                         if t.is_floating_point() else t))
    assert gm.q0_0.dtype == torch.float8_e4m3fn and gm.q0_1.dtype == torch.float32
    assert gm.b0.dtype == torch.bfloat16 and INT4_LINEAR_SAVED not in ops_of(gm)
    out = gm(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and error(expected, out.float())[1] > 0.999


# --- CUDA under FakeTensorMode -------------------------------------------------------------------
def _fake_cuda(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")


def _run(gm: fx.GraphModule, x: torch.Tensor) -> torch.Tensor:
    state = dict(gm.named_buffers())
    return torch.func.functional_call(gm, state, (_fake_cuda(x),))


@pytest.mark.parametrize("lead", LEADS)
@pytest.mark.parametrize("int8_kernel", [False, True], ids=["int8_dequant", "int8_kernel"])
def test_the_module_runs_on_fake_cuda(lead: str, int8_kernel: bool,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 activations; 1 row pads W8A8's ``_int_mm``; int8 weight-only through CUDA's
    ``_weight_int8pack_mm`` (torch >= 2.9) or its dequantized fallback."""
    monkeypatch.setattr(qk, "_has_cuda_kernel", lambda op: int8_kernel)
    gm = fx.symbolic_trace(Quantized(torch.bfloat16))
    x = linear(LEADS[lead])[0].to(torch.bfloat16)
    n_out = gm(x).shape[-1]
    int4_to_saved(gm)  # reading a CPU pack needs its values: not under the fake mode
    with FakeTensorMode(), torch.no_grad():
        move_quantized(gm, lambda: gm._apply(_fake_cuda))  # nibbles -> CUDA pack
        assert gm.q3_0.device.type == "cuda" and gm.q3_0.dtype == torch.int32
        assert gm.q3_0.dim() == 4
        out = _run(gm, x)
    assert out.device.type == "cuda" and out.shape == (*LEADS[lead], n_out)
    assert out.dtype == torch.bfloat16


class CudaKernelChecks(TorchDispatchMode):
    """The checks CUDA's kernels make that torch's meta kernels do not, from their source
    (aten/src/ATen/native/cuda/Blas.cpp ``_int_mm_out_cuda``, ``_scaled_mm`` row-wise;
    aten/src/ATen/native/cuda/int4mm.cu ``_weight_int4pack_mm_cuda``,
    ``_convert_weight_to_int4pack_cuda``), applied to the aten calls on fake CUDA tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        a = {arg.name: v for arg, v in zip(func._schema.arguments, args, strict=False)} | kwargs
        first = next(iter(a.values()))
        if isinstance(first, torch.Tensor) and first.device.type == "cuda":
            name = func.overloadpacket.__name__
            self.seen.add(name)
            if name == "_int_mm":
                m, k, n = a["self"].shape[0], a["self"].shape[1], a["mat2"].shape[1]
                assert m > 16 and k % 8 == 0 and n % 8 == 0, (m, k, n)
            elif name == "_scaled_mm":
                assert a["out_dtype"] == torch.bfloat16  # f8f8bf16_rowwise
                assert a["scale_a"].is_contiguous() and a["scale_b"].is_contiguous()
                assert a["scale_b"].shape == (1, a["mat2"].shape[1])
            elif name == "_convert_weight_to_int4pack":
                w, tiles = a["self"], a["innerKTiles"]
                assert w.dtype == torch.uint8 and w.is_contiguous() and tiles in (2, 4, 8)
                assert (w.shape[1] * 2) % (tiles * 16) == 0
            elif name == "_weight_int4pack_mm":
                x, w, sz = a["self"], a["mat2"], a["qScaleAndZeros"]
                assert x.dtype == torch.bfloat16 and x.is_contiguous() and w.is_contiguous()
                assert w.shape[1] == x.shape[1] // (w.shape[3] * 2 * 16) and w.shape[2] == 32
                assert a["qGroupSize"] in (32, 64, 128, 256) and sz.dtype == torch.bfloat16
                assert tuple(sz.shape) == (x.shape[1] // a["qGroupSize"], w.shape[0] * 8, 2)
        return func(*args, **kwargs)


MM = {"fp8_e4m3": {"_scaled_mm"}, "int8_dynamic": {"_int_mm"},
      "int8_weight_only": {"_weight_int8pack_mm"},
      "int4_weight_only": {"_convert_weight_to_int4pack", "_weight_int4pack_mm"}}
#: the op's body after its checks (a fake mode runs an op's fake, not its body)
KERNELS = {"fp8_e4m3": qk.fp8_linear, "int8_dynamic": qk.int8_dynamic_linear,
           "int8_weight_only": qk.int8_weight_only_linear,
           "int4_weight_only": lambda x, packed, sz, b: qk.int4_linear(x, packed, sz, GROUP, b)}


@pytest.mark.parametrize("lead", LEADS)
@pytest.mark.parametrize("act", DTYPES)
@pytest.mark.parametrize("kernel", BOUNDS)
def test_torch_cuda_meta_kernels_take_what_the_ops_give_them(kernel: str, act: str, lead: str,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """``_scaled_mm`` (row-major x, column-major W, K and N % 16 on CUDA), ``_int_mm`` (padded
    rows), ``_weight_int8pack_mm`` and CUDA's int4 convert and tinygemm (4-D int32, bf16)."""
    x, w, b = linear(LEADS[lead])
    x = x.to(DTYPES[act])
    tensors = pack_linear(kernel, w, DTYPES[act], GROUP)
    nibbles = qk.int4_nibbles(qk.quantize_int4(w, GROUP)[0])
    for int8_kernel in (False, True):
        monkeypatch.setattr(qk, "_has_cuda_kernel", lambda op, on=int8_kernel: on)
        with FakeTensorMode(), torch.no_grad(), CudaKernelChecks() as checks:
            cuda = [_fake_cuda(t) for t in tensors]
            if kernel == "int4_weight_only":
                cuda[0] = qk.int4_pack(_fake_cuda(nibbles))
                assert tuple(qk.int4_unpack(cuda[0]).shape) == (N, K // 2)
            out = KERNELS[kernel](_fake_cuda(x), *cuda, _fake_cuda(b))
        assert out.device.type == "cuda" and out.shape == (*LEADS[lead], N)
        assert out.dtype == DTYPES[act]
        dequantized = kernel == "int8_weight_only" and not int8_kernel
        assert checks.seen >= MM[kernel] if not dequantized else not checks.seen & MM[kernel]


def test_int4_from_saved_packs_for_the_device_asked() -> None:
    gm = quantized_gm()
    int4_to_saved(gm)
    with FakeTensorMode(), torch.no_grad():
        gm._apply(_fake_cuda)
        assert int4_from_saved(gm, "cuda") == 2
        assert tuple(gm.q3_0.shape) == (N // 8, K // (8 * 16), 32, 4)  # 8 inner k-tiles
        assert _run(gm, linear()[0]).shape == (2, 3, 5 * N)


def test_a_cpu_int4_layout_left_on_cuda_is_refused() -> None:
    gm = quantized_gm()  # int4 packed for the CPU, then moved without repacking
    with FakeTensorMode(), torch.no_grad():
        gm._apply(_fake_cuda)
        with pytest.raises(RuntimeError, match="not the cuda int4 layout"):
            _run(gm, linear()[0])


@pytest.mark.parametrize("left", ["q0_1", "q1_0", "q2_1", "b2", "q3_1"])
def test_a_buffer_left_on_the_cpu_is_refused(left: str) -> None:
    gm = quantized_gm()
    int4_to_saved(gm)
    with FakeTensorMode() as mode, torch.no_grad():
        kept = getattr(gm, left)
        gm._apply(_fake_cuda)
        int4_from_saved(gm)
        setattr(gm, left, mode.from_tensor(kept))
        with pytest.raises(RuntimeError, match="is on cpu but x is on cuda"):
            _run(gm, linear()[0])


def test_the_fakes_agree_with_the_kernels() -> None:
    """The output each op's fake gives is the real op's shape, dtype and device."""
    gm = quantized_gm()
    x = linear()[0]
    real = gm(x)
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        fake = gm(x)
    assert fake.shape == real.shape and fake.dtype == real.dtype and fake.device == real.device
