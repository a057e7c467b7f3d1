"""Drop export's ``aten._assert_tensor_metadata`` checks that cannot fail.

torch.export leaves such a check after ops whose result dtype it traced; each costs about
9 us per call on this project's CPU (a tiny Llama has 12). Its device check is already relaxed
(:mod:`.portable`) and the layout of a dense result is always strided, so what is left is
the dtype. A tensor's dtype is *fixed* when it comes only from parameters, buffers and
constants, or from an op that sets it: a cast or factory that names its dtype
(``.to(dtype)``, ``full(dtype=)``), a comparison (bool), an index op (int64), or
``embedding`` (the weight's dtype, whatever the indices). Otherwise it *follows* an input's
dtype through type promotion.

A check on a fixed tensor passes on every call and is dropped. A check on a tensor that
follows an input stays: it is what turns away a call with an input of another dtype. Checks
that also name a size or stride stay too.
"""

from __future__ import annotations

import torch
from torch import fx

from graphopt.backends.torch.fx_utils import aten_name
from graphopt.backends.torch.precision_rules import explicit_dtype

__all__ = ["drop_fixed_asserts"]

_ASSERT = torch.ops.aten._assert_tensor_metadata.default
#: ops whose result dtype does not depend on their inputs' dtypes
_FIXED = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
                    "logical_not", "logical_xor", "isnan", "isinf", "isfinite", "isneginf",
                    "isposinf", "argmax", "argmin"})


def _follows_an_input(graph: fx.Graph) -> set[fx.Node]:
    """The nodes whose dtype follows some graph input's dtype."""
    follows: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder":
            follows.add(node)
            continue
        if node.op != "call_function" or node.target is _ASSERT:
            continue
        name = aten_name(node)
        if name in _FIXED or explicit_dtype(node):
            continue
        deps = node.args[:1] if name == "embedding" else node.all_input_nodes
        if any(d in follows for d in deps if isinstance(d, fx.Node)):
            follows.add(node)
    return follows


def drop_fixed_asserts(gm: fx.GraphModule) -> int:
    """Erase the metadata checks of ``gm``'s graph that cannot fail; returns how many.
    The caller recompiles ``gm``."""
    follows = _follows_an_input(gm.graph)
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _ASSERT or node.users:
            continue
        checked = node.args[0] if node.args else None
        shape = [*node.args[1:3], node.kwargs.get("size"), node.kwargs.get("stride")]
        if not isinstance(checked, fx.Node) or checked in follows \
                or any(s is not None for s in shape):
            continue
        gm.graph.erase_node(node)
        dropped += 1
    return dropped
