"""ONNX ``LSTM``/``GRU``/``RNN``: the GEMM sequence of the recurrence, step by step.

Each step of each direction multiplies the step's input by the gate weights and the previous
hidden state by the recurrence weights (ONNX's operator spec,
https://onnx.ai/onnx/operators/onnx__LSTM.html; GRU and RNN alike), then updates the cell:

* ``x_t @ W^T``: ``[batch, I] x [I, G*H]`` and ``h_{t-1} @ R^T``: ``[batch, H] x [H, G*H]``,
  ``G`` gates (LSTM 4: i, o, f, c; GRU 3: z, r, h; RNN 1), ``2 * batch * G*H * (I + H)`` FLOPs;
* the gate sums: ``x`` part plus ``h`` part (one add per gate element), plus ``Wb`` and ``Rb``
  when ``B`` is given (two more);
* the cell update per hidden unit, counting sigmoid and tanh at 4 FLOPs as
  :mod:`graphopt.analysis.metrics` does: LSTM 3 sigmoids + 2 tanh + ``f*c + i*g`` (3) +
  ``o*tanh(c)`` (1) = 24; GRU 2 sigmoids + 1 tanh + ``r * (h @ Rh)`` (1) +
  ``(1 - z) * h~ + z * h`` (4) = 17; RNN 1 tanh = 4.

over ``seq`` steps, twice for ``direction="bidirectional"``. Its dims are one step's GEMM:
``M = batch``, ``N = G*H``, ``K = I`` (``K_h = H`` for the recurrence), ``steps`` and
``directions``; a batch of one is a sequence of GEMVs. Bytes: each tensor once, as for any node
(the recurrence weights stay in cache between steps).
"""

from __future__ import annotations

from graphopt.ir.graph import Node, TensorInfo

__all__ = ["rnn_dims", "rnn_flops"]

#: gates per step, and FLOPs of the cell update per hidden unit (derived in the docstring)
_CELL = {"LSTM": (4, 24), "GRU": (3, 17), "RNN": (1, 4)}


def _dim(t: TensorInfo | None, i: int) -> int:
    return t.dim(i) if t is not None else 1


def rnn_dims(node: Node, ins: list[TensorInfo | None]) -> dict[str, int]:
    """One step's GEMM dims, with the step and direction counts."""
    gates, _ = _CELL[node.op_type]
    x = ins[0] if ins else None
    w = ins[1] if len(ins) > 1 else None
    batch_first = int(node.attrs.get("layout", 0) or 0) == 1
    hidden = node.attrs.get("hidden_size")
    hidden = int(hidden) if hidden else _dim(w, 1) // gates
    directions = 2 if node.attrs.get("direction") == "bidirectional" else 1
    return {"M": _dim(x, 0 if batch_first else 1), "N": gates * hidden, "K": _dim(x, -1),
            "K_h": hidden, "batch": 1, "steps": _dim(x, 1 if batch_first else 0),
            "directions": directions}


def rnn_flops(node: Node, ins: list[TensorInfo | None], d: dict[str, int]) -> int:
    """The GEMMs, gate sums and cell updates of every step and direction."""
    _, cell = _CELL[node.op_type]
    has_bias = len(ins) > 3 and ins[3] is not None
    gemms = 2 * d["M"] * d["N"] * (d["K"] + d["K_h"])
    sums = d["M"] * d["N"] * (3 if has_bias else 1)
    update = d["M"] * d["K_h"] * cell
    return d["steps"] * d["directions"] * (gemms + sums + update)
