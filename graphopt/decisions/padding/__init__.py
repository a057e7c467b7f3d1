"""Tensor-core padding, decided once on graphopt's IR: which channels to pad, carry and cut.

Identity: zero padding does not change a GEMM's real outputs. With ``W'`` the weight placed at
the real channel positions and zero elsewhere, ``y'[real] = W' x' = W x`` whatever ``x'`` holds
at padded input positions, and ``y'[padded] = 0 + bias 0 = 0``. For attention, zero columns
appended to q and k leave ``q k^T`` unchanged, so with the softmax scale fixed at the original
``1/sqrt(d)`` the scores are the same, and zero columns of v give zero output columns.

Cases (numbered here, once; each module names the ones it handles):

1. Conv, ConvTranspose (groups 1), Linear/Gemm/MatMul with a constant weight: pad C_in/K and
   C_out/N to the multiple tensor cores want for the compute dtype
   (:func:`.cost.required_multiple`). Weights are padded once, ahead of time; an input
   arriving unpadded is padded per call (costed). (:mod:`.gemm`, :mod:`.sites`)
2. Grouped conv: padded per group (each group's block rounded up), or not at all.
3. Depthwise conv is never padded itself (per-group padding multiplies its work); it carries an
   already padded input (groups C -> P, zero weights on padded channels).
4. Padded outputs are carried through channel-local ops and sliced to the real channels where
   an op would see the padding, and at graph outputs (:mod:`.sweep`; the rules, :mod:`.carry`).
   A GEMM consumer absorbs padding with zero weights (identity above), wherever the real
   channels sit. The rules:

   a. Unary ops with ``f(0) = 0`` keep the map; Sigmoid/HardSigmoid keep it dirty (finite junk
      that only zero weights may read); Clip keeps it clean only when ``min <= 0 <= max``.
   b. Inference BatchNormalization/InstanceNormalization are per-channel affine: their params
      are padded (scale 0, bias 0, mean 0, var 1) so padded channels come out as exact zeros.
   c. Add/Sub/Mul/Div of equally padded tensors, of a scalar or channel-broadcast operand, or
      of a per-channel constant padded ahead of time (0, or 1 as a divisor). Dividing by a
      padded tensor is cut (0/0).
   d. Pools and reductions over other axes are channel-local; a reduction, Softmax or
      LayerNorm over the channel axis would count the padding: cut.
   e. Reshape/Flatten/Squeeze/Unsqueeze that keep the channel axis whole or merge it with real
      axes (:func:`.channel_map.reshape_map`; an explicit Reshape size is rewritten);
      Transpose moves the axis; Slice of another axis keeps it.
   f. Concat along the channel axis places the maps at offsets; along another axis it needs
      equal maps.
   g. Anything else is unknown and cut.

5. Attention with an unaligned head_dim: q, k, v padded per call with zeros, scale kept
   (:mod:`.attention`).

Legality (:func:`.sites.can_pad`, and the backend's ``can_edit``, both a
:class:`~graphopt.ir.legality.Legality`) is decided apart from profitability
(:func:`.gemm.should_pad`: the roofline model): with ``pad="auto"`` a node is padded only when
predicted at least ``pad_margin`` times faster (Inductor's pad_mm uses 1.1x), counting extra
FLOPs, per-call pad/slice copies and the extra bytes of carried ops (:mod:`.downstream`).

State: the cases read a :class:`.state.SweepState` and return an :class:`.state.Outcome`;
:func:`plan_padding`, the family's one entry, is the only writer. Decisions: ``padding`` on
every GEMM-like and attention node (old -> new dims, waste_pct, predicted_gain, reason,
``applied``); ``padding_carry`` on each op a padded tensor passes through; ``padding_slice``
where it is sliced back. Both backends apply the returned :class:`.steps.PaddingPlan` and decide
nothing.
"""

from __future__ import annotations

from graphopt.decisions.padding.carry import PadConst, SetGroups, SetShape
from graphopt.decisions.padding.channel_map import ChannelMap, scatter_axis, scatter_weight
from graphopt.decisions.padding.cost import required_multiple
from graphopt.decisions.padding.sites import SMALL_VALUE, Values
from graphopt.decisions.padding.steps import (
    AttentionStep,
    CarryStep,
    ContextBackend,
    GemmStep,
    PadBackend,
    PaddingPlan,
)
from graphopt.decisions.padding.sweep import plan_padding

__all__ = [
    "SMALL_VALUE",
    "AttentionStep",
    "CarryStep",
    "ChannelMap",
    "ContextBackend",
    "GemmStep",
    "PadBackend",
    "PadConst",
    "PaddingPlan",
    "SetGroups",
    "SetShape",
    "Values",
    "plan_padding",
    "required_multiple",
    "scatter_axis",
    "scatter_weight",
]
