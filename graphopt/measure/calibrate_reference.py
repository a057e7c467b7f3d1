"""The two end-to-end numbers ``graphopt calibrate`` fits: how much slower an op is in a model.

Per-op fixed costs are timed in a stream of bare calls. Inside a model each op also pays for
the Python around it (``nn.Module.__call__``, argument handling, the framework's glue), which
evicts the op's code and branch history from the core between calls. That slowdown is a
property of the machine and the interpreter, not of any op, so it is fitted once, apart for
ops that launch a kernel and for views (dispatch only; in a model they restride tensors of
higher rank than the bench's): three small reference models (a pre-norm transformer block, a
rotary/SwiGLU block with a hand-written RMSNorm, a residual conv block; plain torch, built
here) are planned with the bench costs and measured node by node the way ``graphopt profile``
measures (torch.profiler over an fx Interpreter), and

    kernel factor = (measured kernel nodes - predicted work) / their bench fixed costs
    view factor = measured view nodes / their bench fixed costs

scale the fixed costs. The blocks are measured in rounds spread over the calibration
(``measure_blocks``, one round ~10 ms) and each node keeps its fastest round's median: the fit
sets the scale of every fixed cost, so a neighbour's burst on a shared host must cover every
round to move it (with one round, a burst put the zoo's predictions 1.4-1.75x over). The
models graphopt is checked on (``benchmarks/bench_profile.py``) are not used for the fit.
"""

from __future__ import annotations

import logging
from typing import Any

from graphopt.analysis.kernel_class import KernelClass
from graphopt.decisions.planner import build_plan
from graphopt.frontends import load_graph
from graphopt.hardware.profile import HardwareProfile

__all__ = ["FACTOR_BOUNDS", "in_graph_factors", "measure_blocks", "reference_blocks",
           "reference_models"]

logger = logging.getLogger(__name__)

#: a fit outside these bounds means a noisy machine, not a property of it: clamped
FACTOR_BOUNDS = (0.5, 3.0)
#: (module, inputs, traced graph) of one reference block
Block = tuple[Any, tuple[Any, ...], Any]


def reference_models() -> list[tuple[Any, tuple[Any, ...]]]:
    """(module, inputs) pairs: two transformer blocks on 2 x 16 x 64, a conv block on
    2 x 16 x 16 x 16; seeded weights, eval mode."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, dim: int = 64, heads: int = 4) -> None:
            super().__init__()
            self.heads = heads
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, -1).unbind(2)
            att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                 v.transpose(1, 2), is_causal=True)
            x = x + self.out(att.transpose(1, 2).reshape(b, s, d))
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    class ConvBlock(nn.Module):
        def __init__(self, c: int = 16, classes: int = 10) -> None:
            super().__init__()
            self.conv1, self.conv2 = (nn.Conv2d(c, c, 3, padding=1, bias=False)
                                      for _ in range(2))
            self.bn1, self.bn2 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)
            self.head = nn.Linear(c, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.relu(self.bn1(self.conv1(x)))
            y = F.relu(self.bn2(self.conv2(y)) + x)
            return self.head(F.adaptive_avg_pool2d(F.max_pool2d(y, 2), 1).flatten(1))

    class GatedBlock(nn.Module):
        """RMSNorm by hand, rotary embedding, SwiGLU: many small elementwise ops and views."""

        def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128) -> None:
            super().__init__()
            self.heads, self.half = heads, dim // heads // 2
            self.scale = nn.Parameter(torch.ones(dim))
            self.qkv, self.out = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim)
            self.gate, self.up = nn.Linear(dim, hidden), nn.Linear(dim, hidden)
            self.down = nn.Linear(hidden, dim)

        def norm(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale

        def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            x1, x2 = x[..., :self.half], x[..., self.half:]
            return x * cos + torch.cat((-x2, x1), dim=-1) * sin

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, d = x.shape
            pos = torch.arange(s, dtype=torch.float32)[:, None]
            freq = pos / 10000 ** (torch.arange(self.half, dtype=torch.float32) / self.half)
            angle = torch.cat((freq, freq), dim=-1)
            cos, sin = angle.cos(), angle.sin()
            q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, -1).transpose(1, 3) \
                .unbind(2)
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(att.transpose(1, 2).reshape(b, s, d))
            h = self.norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    torch.manual_seed(0)
    return [(Block().eval(), (torch.randn(2, 16, 64),)),
            (GatedBlock().eval(), (torch.randn(2, 16, 64),)),
            (ConvBlock().eval(), (torch.randn(2, 16, 16, 16),))]


def reference_blocks() -> list[Block]:
    """:func:`reference_models`, each traced once."""
    return [(module, inputs, load_graph(module, inputs))
            for module, inputs in reference_models()]


def measure_blocks(blocks: list[Block]) -> list[dict[str, float]]:
    """One round: each block's per-node median over 20 runs, as ``graphopt profile``
    measures."""
    from graphopt.measure.torch_runs import measure_torch

    return [dict(measure_torch(graph, module, inputs, {}, runs=20, warmup=3).per_node)
            for module, inputs, graph in blocks]


def in_graph_factors(profile: HardwareProfile, blocks: list[Block] | None = None,
                     rounds: list[list[dict[str, float]]] | None = None
                     ) -> tuple[float, float, str]:
    """(kernel factor, view factor, how they were found) for ``profile``'s fixed costs: one
    for ops that launch a kernel, one for views (dispatch only, whose cost in a model grows
    with the rank of the tensors they restride); see the module doc. ``rounds`` are
    :func:`measure_blocks` of ``blocks`` (default: one round now)."""
    blocks = blocks if blocks is not None else reference_blocks()
    rounds = rounds or [measure_blocks(blocks)]
    measured = {True: 0.0, False: 0.0}
    fixed = {True: 0.0, False: 0.0}
    work = 0.0
    for i, (_, _, graph) in enumerate(blocks):
        got: dict[str, float] = {}
        for r in rounds:  # each node's fastest round
            for name, t in r[i].items():
                got[name] = min(t, got.get(name, t))
        plan = build_plan(graph, profile)
        for node in plan.nodes:
            if got.get(node.name, 0.0) > 0 and node.cost.overhead_s > 0:
                view = node.analysis.kernel_class is KernelClass.VIEW
                measured[view] += got[node.name]
                fixed[view] += node.cost.overhead_s
                work += node.cost.est_time_s - node.cost.overhead_s
    low, high = FACTOR_BOUNDS
    raw_kernel = (measured[False] - work) / fixed[False] if fixed[False] > 0 else 1.0
    raw_view = measured[True] / fixed[True] if fixed[True] > 0 else 1.0
    kernel, view = (min(max(raw, low), high) for raw in (raw_kernel, raw_view))
    how = (f"in-model factors {kernel:.3g} for kernels, {view:.3g} for views (three reference "
           f"blocks measured node by node as graphopt profile does: kernels "
           f"{measured[False] * 1e6:.0f} us against {work * 1e6:.0f} us of work + "
           f"{fixed[False] * 1e6:.0f} us of bench fixed costs, views "
           f"{measured[True] * 1e6:.0f} us against {fixed[True] * 1e6:.0f} us" +
           ("; clamped" if (kernel, view) != (raw_kernel, raw_view) else "") + ")")
    logger.info("calibrate: %s", how)
    return kernel, view, how
