"""Pack a Linear's weight into a low-bit format and run it with torch's own kernel (issue 22):
the building blocks of the graph ops in :mod:`.quant_ops`, which the torch quantize pass uses.
Legality (which K, N, dtypes and groups each kernel takes) is
:mod:`graphopt.decisions.quantization.torch_kernels`'s; call ``kernel_refuses`` first, since one of
these kernels crashes the process on a shape it does not take.

Each ``pack_*`` returns plain tensors (no tensor subclass, nothing pickled), so a module that
holds them saves through ``torch.export`` like any other; each ``*_linear`` computes
``x @ W.T + b`` for ``x`` of any leading shape, in ``x``'s dtype, on the CPU or on CUDA (the
device of its tensors).

Formats and their approximations:
- FP8 e4m3: ``W ~= s_n * q_n`` per output row (``s_n = max|W_n| / 448``, e4m3's largest finite
  value); ``x`` per token the same way on every call; ``_scaled_mm`` accumulates in fp32 and
  writes bf16 (the one output CUDA's row-wise FP8 kernel has), then cast to ``x``'s dtype.
- INT8 (both kinds): ``W ~= s_n * q_n``, ``q`` int8 symmetric per row (:func:`quantize_rows_int8`:
  ``s_n = max|W_n| / 127``). Weight-only keeps ``x`` as it is; dynamic (W8A8) quantizes ``x``
  per token the same way on every call and multiplies in int32 (``_int_mm``).
- INT4 weight-only: per group of ``g`` inputs, asymmetric: ``W ~= (q - 8) * s + z`` with ``q``
  in 0..15, ``s = (max - min) / 15`` and ``z = min + 8 s`` (tinygemm's convention: the zero is
  a float, so a group's range is used whole).

INT4 layouts. The packed weight is a layout of the device's kernel, not a portable format:
- the *nibbles* form (:func:`int4_nibbles`), uint8 (N, K/2) with ``q[n, 2j]`` in the high nibble
  and ``q[n, 2j+1]`` in the low one, is what gets saved; it is the input of CUDA's convert;
- CPU: ``_convert_weight_to_int4pack_for_cpu``, uint8 (N, K/2), a permutation of the nibbles
  that depends on the ISA torch picked at run time (aten/src/ATen/native/cpu/int4mm_kernel.cpp,
  ``weight_to_int4pack_kernel``: BLOCK_N = 4 float vectors, 64 rows on AVX512, 32 on AVX2);
- CUDA: ``_convert_weight_to_int4pack``, int32 (N/8, K/(16 t), 32, t/2) for ``t`` inner k-tiles
  (aten/src/ATen/native/cuda/int4mm.cu; ROCm fills the same shape in another order).
:func:`int4_pack` makes a device's layout from nibbles, :func:`int4_unpack` gets nibbles back.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

__all__ = ["fp8_linear", "int4_inner_k_tiles", "int4_linear", "int4_nibbles", "int4_pack",
           "int4_unpack", "int8_dynamic_linear", "int8_weight_only_linear", "pack_fp8", "pack_int4",
           "pack_int8_weight_only", "quantize_int4", "quantize_rows_int8"]

_E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
_INT8_MAX = 127  # symmetric: -127..127, so that -q is always representable
_TINY = 1e-12
#: _int_mm_out_cuda (aten/src/ATen/native/cuda/Blas.cpp): "self.size(0) needs to be greater
#: than 16"; K and N must be positive multiples of 8 (a legality rule, not padded here)
_CUDA_INT_MM_MIN_ROWS = 17
#: _convert_weight_to_int4pack_cuda (aten/src/ATen/native/cuda/int4mm.cu): innerKTiles in
#: {2, 4, 8} and K % (innerKTiles * 16) == 0; the largest that fits loads 16 bytes at a time
_INNER_K_TILES = (8, 4, 2)


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    return x.reshape(-1, x.shape[-1]), tuple(x.shape[:-1])


def _bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return y if bias is None else y + bias.to(y.dtype)


def _row_scale(t: torch.Tensor, qmax: float) -> torch.Tensor:
    return (t.abs().amax(dim=-1, keepdim=True) / qmax).clamp_min(_TINY)


def quantize_rows_int8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row (last dim): ``t ~= scale[..., None] * q``.

    Returns (int8 ``q``, fp32 ``scale`` of shape ``t.shape[:-1]``), ``scale = max|row| / 127``:
    the one quantizer of weights and of per-token activations, so that every INT8 path rounds
    the same way.
    """
    tf = t.detach().float()
    scale = _row_scale(tf, _INT8_MAX)
    q = torch.round(tf / scale).clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    return q, scale.squeeze(-1)


# --- FP8 e4m3 ------------------------------------------------------------------------------------
def pack_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight (N, K), fp32 scale (N, 1)) with one scale per output row."""
    w = weight.detach().float()
    scale = _row_scale(w, _E4M3_MAX)
    return (w / scale).to(torch.float8_e4m3fn), scale


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + b`` with ``x`` quantized to e4m3 per token (dynamic) and ``_scaled_mm``.

    The output is bf16 before the cast to ``x``'s dtype: CUDA's row-wise scaled kernel
    (``f8f8bf16_rowwise``, sm89/sm90/sm100) writes nothing else; the CPU does the same, so both
    devices round alike.
    """
    rows, lead = _rows(x)
    xf = rows.float()
    x_scale = _row_scale(xf, _E4M3_MAX)
    y = torch._scaled_mm((xf / x_scale).to(torch.float8_e4m3fn), weight.t(),
                         scale_a=x_scale, scale_b=scale.float().reshape(1, -1),
                         out_dtype=torch.bfloat16)
    return _bias(y.to(x.dtype), bias).reshape(*lead, weight.shape[0])


# --- INT8 ----------------------------------------------------------------------------------------
def pack_int8_weight_only(weight: torch.Tensor, act_dtype: torch.dtype
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight (N, K), scale (N,) in the activations' dtype), symmetric per row."""
    q, scale = quantize_rows_int8(weight)
    return q, scale.to(act_dtype)


def _has_cuda_kernel(op: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CUDA")


def int8_weight_only_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (s * q).T + b`` with ``_weight_int8pack_mm``.

    CUDA: torch has a kernel since pytorch PR #159325 (2025; aten/src/ATen/native/cuda/int8mm.cu,
    fp32 on the CUDA cores, no tensor cores), used where this torch has it; an older torch
    dequantizes the weight (``q.to(x.dtype) * s``) and runs ``F.linear``: the same result to
    rounding, more memory traffic. Which one is decided at run time, on the loading machine.
    """
    rows, lead = _rows(x)
    scale = scale.to(x.dtype)  # the CPU kernel takes the scale in x's dtype only
    crashes = x.device.type == "cpu" and x.dtype == torch.bfloat16 and x.shape[-1] % 32 != 0
    if crashes or x.device.type == "cuda" and not _has_cuda_kernel("_weight_int8pack_mm"):
        # ``crashes``: the CPU kernel segfaults on this shape (quantization.torch_kernels, case 2);
        # graphopt never builds it, but a file can name it: the same numbers, no crash
        y = F.linear(rows, weight.to(x.dtype) * scale.unsqueeze(1))
    else:
        y = torch._weight_int8pack_mm(rows.contiguous(), weight, scale)
    return _bias(y, bias).reshape(*lead, weight.shape[0])


def int8_dynamic_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8: ``x`` quantized per token to int8, ``_int_mm`` (int32 accumulate), dequantized by
    ``x_scale * w_scale``. ``weight``/``scale`` are :func:`quantize_rows_int8` of W.

    CUDA's ``_int_mm`` (cuBLASLt) needs more than 16 rows: fewer are padded with zero rows and
    sliced off again.
    """
    rows, lead = _rows(x)
    xq, x_scale = quantize_rows_int8(rows)
    m = xq.shape[0]
    if x.device.type == "cuda" and m < _CUDA_INT_MM_MIN_ROWS:
        xq = F.pad(xq, (0, 0, 0, _CUDA_INT_MM_MIN_ROWS - m))
    acc = torch._int_mm(xq, weight.t()).narrow(0, 0, m)
    y = (acc.float() * x_scale.unsqueeze(1) * scale.float().unsqueeze(0)).to(x.dtype)
    return _bias(y, bias).reshape(*lead, weight.shape[0])


# --- INT4 ----------------------------------------------------------------------------------------
def quantize_int4(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 ``q`` (N, K) in 0..15, fp32 scales and zeros (K / group, N, 2)), tinygemm's
    convention ``W ~= (q - 8) * scale + zero`` per group of ``group`` inputs."""
    w = weight.detach().float()
    n, k = w.shape
    grouped = w.reshape(n, k // group, group)
    low, high = grouped.amin(dim=-1, keepdim=True), grouped.amax(dim=-1, keepdim=True)
    scale = ((high - low) / 15).clamp_min(_TINY)
    q = torch.round((grouped - low) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = low + 8 * scale
    scales_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1)
    return q, scales_zeros.transpose(0, 1).contiguous()


def int4_nibbles(q: torch.Tensor) -> torch.Tensor:
    """The saved form: uint8 (N, K/2), ``q[n, 2j]`` high nibble, ``q[n, 2j+1]`` low."""
    pairs = q.to(torch.uint8).reshape(q.shape[0], -1, 2)
    return (pairs.select(-1, 0) << 4) | pairs.select(-1, 1)


def _q_of_nibbles(nibbles: torch.Tensor) -> torch.Tensor:
    return torch.stack([nibbles >> 4, nibbles & 15], dim=-1).reshape(nibbles.shape[0], -1)


def int4_inner_k_tiles(k: int) -> int:
    """The inner k-tiles of the CUDA int4 layout for K inputs: the largest that divides."""
    for tiles in _INNER_K_TILES:
        if k % (tiles * 16) == 0:
            return tiles
    raise RuntimeError(f"K={k}: CUDA's int4 packing needs K to be a multiple of 32")


def int4_pack(nibbles: torch.Tensor) -> torch.Tensor:
    """The packed weight for the device ``nibbles`` is on (CPU or CUDA)."""
    if nibbles.device.type == "cpu":
        return torch._convert_weight_to_int4pack_for_cpu(_q_of_nibbles(nibbles).to(torch.int32), 1)
    if nibbles.device.type == "cuda":
        tiles = int4_inner_k_tiles(nibbles.shape[1] * 2)
        return torch.ops.aten._convert_weight_to_int4pack(nibbles.contiguous(), tiles)
    raise RuntimeError(f"no int4 kernel for device {nibbles.device} (torch's int4 matmul runs "
                       "on the CPU and on CUDA)")


def pack_int4(weight: torch.Tensor, group: int, act_dtype: torch.dtype
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(int4 weight packed for ``weight``'s device, scales and zeros (K / group, N, 2) in the
    activations' dtype)."""
    q, scales_zeros = quantize_int4(weight, group)
    return int4_pack(int4_nibbles(q)), scales_zeros.to(act_dtype)


#: rows whose CPU pack is read back with one learned order: the pack is laid out in blocks of
#: BLOCK_N rows (64 on AVX-512, 32 on AVX2: int4mm_kernel.cpp), which divide it, so each chunk
#: of rows packs as a matrix of its own; :func:`int4_unpack` checks that by packing again
_ROW_CHUNK = 256


@functools.lru_cache(maxsize=8)
def _cpu_int4_order(n: int, k: int) -> torch.Tensor:
    """Where the CPU pack puts each nibble, for (N, K), on this process's ISA: packed nibble
    ``p`` (byte ``p // 2``, low nibble first) holds ``q.flatten()[order[p]]``.

    Learned by packing the base-16 digits of each element's index, one digit plane at a time,
    and reading them back; checked to be a bijection. Asked for chunks of at most
    ``_ROW_CHUNK`` rows, so a cached order is at most 256 x K int32s (4 MiB at K = 4096).
    """
    total = n * k
    if total >= 2 ** 31:
        raise RuntimeError(f"int4 weight ({n}, {k}): too large to unpack its CPU layout")
    index = torch.arange(total, dtype=torch.int32)
    order = torch.zeros(total, dtype=torch.int32)
    digit = 0
    while digit == 0 or 16 ** digit < total:
        plane = ((index >> (4 * digit)) & 15).reshape(n, k)
        packed = torch._convert_weight_to_int4pack_for_cpu(plane, 1)
        if packed.dtype != torch.uint8 or packed.numel() * 2 != total:
            raise RuntimeError(f"torch's CPU int4 pack of ({n}, {k}) is {packed.dtype} "
                               f"{tuple(packed.shape)}, not a uint8 of N*K/2 bytes: graphopt "
                               "cannot read this torch's int4 layout back")
        order |= torch.stack([packed & 15, packed >> 4], dim=-1).reshape(-1).to(torch.int32) \
            << (4 * digit)
        digit += 1
    if not bool(torch.bincount(order.long(), minlength=total).eq(1).all()):
        raise RuntimeError(f"torch's CPU int4 pack of ({n}, {k}) is not a permutation of the "
                           "weights' nibbles: graphopt cannot read this torch's int4 layout back")
    return order


def _cuda_int4_unpack(packed: torch.Tensor) -> torch.Tensor:
    """Run the kernel on the identity with scale 1 and zero 8: dequant = (q - 8) + 8 = q,
    exact in bf16. Needs a real GPU (it computes)."""
    n = packed.shape[0] * 8
    k = packed.shape[1] * packed.shape[3] * 2 * 16
    eye = torch.eye(k, dtype=torch.bfloat16, device=packed.device)
    ones = torch.ones(k // 32, n, dtype=torch.bfloat16, device=packed.device)
    scales_zeros = torch.stack([ones, 8 * ones], dim=-1)
    q = torch.ops.aten._weight_int4pack_mm(eye, packed, 32, scales_zeros).t()
    return int4_nibbles(q.round().to(torch.uint8))


def _pack_cpu(q: torch.Tensor) -> torch.Tensor:
    return torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)


def _cpu_int4_unpack(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """The 4-bit values (N, K) of a CPU pack, read ``rows`` rows at a time with the order
    learned for a chunk of that many rows (and one for the last, shorter chunk)."""
    n, k = packed.shape[0], packed.shape[1] * 2
    q = torch.empty(n, k, dtype=torch.uint8)
    for start in range(0, n, rows):
        chunk = packed[start:start + rows]
        h = chunk.shape[0]
        values = torch.empty(h * k, dtype=torch.uint8)
        values[_cpu_int4_order(h, k)] = torch.stack([chunk & 15, chunk >> 4], dim=-1).reshape(-1)
        q[start:start + h] = values.reshape(h, k)
    return q


def int4_unpack(packed: torch.Tensor) -> torch.Tensor:
    """The nibbles form of a packed int4 weight, on the pack's device."""
    if packed.device.type == "cpu" and packed.dim() == 2 and packed.dtype == torch.uint8:
        q = _cpu_int4_unpack(packed, _ROW_CHUNK)
        if not torch.equal(_pack_cpu(q), packed):  # not row-chunk-local here: learn it whole
            q = _cpu_int4_unpack(packed, packed.shape[0])
            if not torch.equal(_pack_cpu(q), packed):
                raise RuntimeError("torch's CPU int4 pack could not be read back: packing the "
                                   "read-back weights does not give the same bytes")
        return int4_nibbles(q)
    if packed.device.type == "cuda" and packed.dim() == 4 and packed.dtype == torch.int32:
        return _cuda_int4_unpack(packed)
    raise RuntimeError(f"int4_unpack: a {packed.dtype} {tuple(packed.shape)} on {packed.device} "
                       "is neither a CPU pack (uint8, 2-D) nor a CUDA pack (int32, 4-D)")


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + b`` with torch's int4 kernel for ``packed``'s device (a CPU or CUDA pack).

    CUDA's tinygemm takes bf16 only (``_weight_int4pack_mm_cuda``): other activations, and
    the scales, are cast to bf16 there and the result back.
    """
    rows, lead = _rows(x)
    n = scales_zeros.shape[1]
    if packed.device.type == "cuda":
        y = torch.ops.aten._weight_int4pack_mm(rows.to(torch.bfloat16).contiguous(), packed,
                                               group, scales_zeros.to(torch.bfloat16))
        y = y.to(x.dtype)
    else:
        y = torch._weight_int4pack_mm_for_cpu(rows.contiguous(), packed, group,
                                              scales_zeros.to(x.dtype))
    return _bias(y, bias).reshape(*lead, n)
