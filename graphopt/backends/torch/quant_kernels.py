"""Pack a Linear's weight into a low-bit format and run it with torch's own kernel (issue 22):
the building blocks the torch quantize pass puts in the graph. Legality (which K, N, dtypes
and groups each kernel takes) is :mod:`graphopt.decisions.torch_quant_kernels`'s; call
``kernel_refuses`` first, since one of these kernels crashes the process on a shape it does
not take.

Each ``pack_*`` returns plain tensors (no tensor subclass, nothing pickled), so a module that
holds them saves through ``torch.export`` like any other; each ``*_linear`` computes
``x @ W.T + b`` for ``x`` of any leading shape, in ``x``'s dtype.

Formats and their approximations:
- FP8 e4m3: ``W ~= s_n * q_n`` per output row (``s_n = max|W_n| / 448``, e4m3's largest finite
  value); ``x`` per token the same way on every call; ``_scaled_mm`` accumulates in fp32.
- INT8 weight-only: ``W ~= s_n * q_n``, ``q`` int8 symmetric (``s_n = max|W_n| / 127``).
- INT4 weight-only: per group of ``g`` inputs, asymmetric: ``W ~= (q - 8) * s + z`` with ``q``
  in 0..15, ``s = (max - min) / 15`` and ``z = min + 8 s`` (tinygemm's convention: the zero is
  a float, so a group's range is used whole).
"""

from __future__ import annotations

import torch

__all__ = ["fp8_linear", "int4_linear", "int8_weight_only_linear", "pack_fp8", "pack_int4",
           "pack_int8_weight_only"]

_E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
_TINY = 1e-12


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    return x.reshape(-1, x.shape[-1]), tuple(x.shape[:-1])


def _bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return y if bias is None else y + bias.to(y.dtype)


def pack_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight (N, K), fp32 scale (N, 1)) with one scale per output row."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1, keepdim=True) / _E4M3_MAX).clamp_min(_TINY)
    return (w / scale).to(torch.float8_e4m3fn), scale


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + b`` with ``x`` quantized to e4m3 per token (dynamic) and ``_scaled_mm``."""
    rows, lead = _rows(x)
    xf = rows.float()
    x_scale = (xf.abs().amax(dim=1, keepdim=True) / _E4M3_MAX).clamp_min(_TINY)
    y = torch._scaled_mm((xf / x_scale).to(torch.float8_e4m3fn), weight.t(),
                         scale_a=x_scale, scale_b=scale.t(), out_dtype=torch.float32)
    return _bias(y, bias).to(x.dtype).reshape(*lead, weight.shape[0])


def pack_int8_weight_only(weight: torch.Tensor, act_dtype: torch.dtype
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight (N, K), scale (N,) in the activations' dtype), symmetric per row."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp_min(_TINY)
    q = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
    return q, scale.to(act_dtype)


def int8_weight_only_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    rows, lead = _rows(x)
    y = torch._weight_int8pack_mm(rows.contiguous(), weight, scale)
    return _bias(y, bias).reshape(*lead, weight.shape[0])


def pack_int4(weight: torch.Tensor, group: int, act_dtype: torch.dtype
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed int4 weight, scales and zeros (K / group, N, 2) in the activations' dtype)."""
    w = weight.detach().float()
    n, k = w.shape
    grouped = w.reshape(n, k // group, group)
    low, high = grouped.amin(dim=-1, keepdim=True), grouped.amax(dim=-1, keepdim=True)
    scale = ((high - low) / 15).clamp_min(_TINY)
    q = torch.round((grouped - low) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = low + 8 * scale
    scales_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    return packed, scales_zeros.transpose(0, 1).contiguous().to(act_dtype)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    rows, lead = _rows(x)
    y = torch._weight_int4pack_mm_for_cpu(rows.contiguous(), packed, group, scales_zeros)
    return _bias(y, bias).reshape(*lead, scales_zeros.shape[1])
