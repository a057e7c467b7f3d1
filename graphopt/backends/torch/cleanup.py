"""Inference cleanup: fold eval-mode BatchNorm into the conv/linear before it; drop dropout.

Identities:

1. BatchNorm in eval mode is a per-channel affine map ``y = (x - mu) * g / s + beta`` with
   ``s = sqrt(var + eps)``. After ``x = conv(z, W, b)`` it folds into the conv:
   ``W' = W * (g / s)`` (per output channel) and ``b' = (b - mu) * g / s + beta``. The same
   holds for ``linear`` followed by BatchNorm1d over its features.
2. Dropout in eval mode (``train=False``) is the identity.

Not folded (the report says why): a conv whose output has other readers besides the BN (the
un-normalized value is needed), transposed convs (per-group weight layout; left as is), and a
BN in training mode.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch
from torch import fx

from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.fx_utils import get_tensor, is_aten, new_param
from graphopt.ir.decision_details import Detail, DropDetail, FoldDetail

__all__ = ["BATCHNORMS", "DROPOUTS", "FOLDS_INTO", "fold_batchnorm_and_drop_dropout",
           "record_fold"]

logger = logging.getLogger(__name__)


class _Decides(Protocol):
    def decide(self, node: Any, detail: Detail, reason: str, *,
               applied: bool = True) -> Any: ...

#: the ATen ops this pass reads, and the reasons it records: shared with its IR view
#: (:mod:`.cleanup_view`)
FOLDS_INTO = ("conv1d", "conv2d", "conv3d", "linear")
BATCHNORMS = ("batch_norm", "_native_batch_norm_legit_no_training")
DROPOUTS = ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")
NOT_AFTER_GEMM = "kept: the BatchNorm does not follow a conv or linear"
TRAINING_BN = "BatchNorm is in training mode"
STATS_NOT_CONSTANT = "running statistics are not constants"
WEIGHT_NOT_CONSTANT = "kept: the weight is not a constant"
TRAINING_DROPOUT = "kept: dropout in training mode"
DROPPED = "removed: dropout is the identity in eval mode"


def other_readers(src: str) -> str:
    return f"kept: {src}'s output has other readers that need it un-normalized"


def record_fold(ctx: _Decides, bn: str, src: str) -> None:
    """The decisions of one folded BatchNorm, on it and on the op that absorbs it."""
    ctx.decide(bn, FoldDetail(into=src), f"folded into {src}: eval BatchNorm is affine "
               "(W' = W*g/s, b' = (b-mu)*g/s + beta)")
    ctx.decide(src, FoldDetail(absorbed=bn), f"absorbed BatchNorm {bn}")


def _bn_params(gm: fx.GraphModule, bn: fx.Node):
    """(gamma, beta, mean, var, eps) of an eval-mode BN node, or a reason it is not one."""
    if is_aten(bn, "batch_norm"):
        x, w, b, mean, var, training, _momentum, eps = bn.args[:8]
    else:  # _native_batch_norm_legit_no_training(x, w, b, mean, var, momentum, eps)
        x, w, b, mean, var, _momentum, eps = bn.args[:7]
        training = False
    if training:
        return TRAINING_BN
    tensors = [get_tensor(gm, n) if isinstance(n, fx.Node) else None for n in (mean, var)]
    if any(t is None for t in tensors):
        return STATS_NOT_CONSTANT
    mean_t, var_t = tensors
    gamma = get_tensor(gm, w) if isinstance(w, fx.Node) else None
    beta = get_tensor(gm, b) if isinstance(b, fx.Node) else None
    c = mean_t.shape[0]
    gamma = torch.ones(c, dtype=mean_t.dtype) if gamma is None else gamma
    beta = torch.zeros(c, dtype=mean_t.dtype) if beta is None else beta
    return gamma, beta, mean_t, var_t, float(eps)


def _fold_one(gm: fx.GraphModule, ctx: RewriteContext, bn: fx.Node) -> bool:
    src = bn.args[0]
    if not isinstance(src, fx.Node) or not is_aten(src, *FOLDS_INTO):
        ctx.decide(bn, FoldDetail(), NOT_AFTER_GEMM, applied=False)
        return False
    if len(src.users) != 1:
        ctx.decide(bn, FoldDetail(), other_readers(src.name), applied=False)
        return False
    params = _bn_params(gm, bn)
    if isinstance(params, str):
        ctx.decide(bn, FoldDetail(), f"kept: {params}", applied=False)
        return False
    gamma, beta, mean, var, eps = params
    w_node = src.args[1]
    b_node = src.args[2] if len(src.args) > 2 else None
    w = get_tensor(gm, w_node)
    if w is None:
        ctx.decide(bn, FoldDetail(), WEIGHT_NOT_CONSTANT, applied=False)
        return False
    b = get_tensor(gm, b_node) if isinstance(b_node, fx.Node) else None
    scale = (gamma.double() / torch.sqrt(var.double() + eps))
    shape = (-1,) + (1,) * (w.dim() - 1)
    new_w = (w.double() * scale.reshape(shape)).to(w.dtype)
    base = torch.zeros_like(mean, dtype=torch.float64) if b is None else b.double()
    new_b = ((base - mean.double()) * scale + beta.double()).to(w.dtype)
    args = list(src.args)
    while len(args) < 3:
        args.append(None)
    args[1] = new_param(gm, f"{src.name}_weight", new_w, src)
    args[2] = new_param(gm, f"{src.name}_bias", new_b, src)
    src.args = tuple(args)
    bn.replace_all_uses_with(src)
    gm.graph.erase_node(bn)
    record_fold(ctx, bn.name, src.name)
    logger.debug("folded %s into %s", bn.name, src.name)
    return True


def fold_batchnorm_and_drop_dropout(gm: fx.GraphModule, ctx: RewriteContext) -> bool:
    """Fold eval BatchNorms into their producer and remove eval-mode dropouts (identities)."""
    changed = False
    for node in list(gm.graph.nodes):
        if is_aten(node, *BATCHNORMS):
            changed |= _fold_one(gm, ctx, node)
        elif is_aten(node, *DROPOUTS):
            train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", False)
            if train:
                ctx.decide(node, DropDetail(), TRAINING_DROPOUT, applied=False)
                continue
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            ctx.decide(node.name, DropDetail(), DROPPED)
            changed = True
    if changed:
        gm.graph.eliminate_dead_code()
    return changed
