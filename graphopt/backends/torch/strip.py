"""The optimized graph made lean for running: export's shape guard and the dtype checks that
cannot fail dropped, unread weights freed, plain positional calls and sizes, device-portable
constants. Run on the module ``optimize`` returns and on one ``graphopt.load`` reads back."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from graphopt.backends.torch.asserts import drop_fixed_asserts
from graphopt.backends.torch.portable import make_portable

__all__ = ["strip_unused"]


def strip_unused(gm: fx.GraphModule) -> dict[str, Any]:
    """Drop the export-time shape guard (the module wrapper checks shapes), the dtype checks
    that cannot fail (:mod:`.asserts`) and the parameters no node reads any more (e.g. a folded
    BatchNorm's), so they do not cost memory; make the graph device-portable (returns what
    :func:`~graphopt.backends.torch.portable.make_portable` changed)."""
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            gm.graph.erase_node(node)
    drop_fixed_asserts(gm)  # ~9 us a call each, and they cannot fail
    gm.graph.eliminate_dead_code()
    portable = make_portable(gm)  # any device: constants to buffers
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_parameters()) + list(gm.named_buffers()):
        if name not in used:
            owner_name, _, attr = name.rpartition(".")
            owner = gm.get_submodule(owner_name) if owner_name else gm
            delattr(owner, attr)
    gm.delete_all_unused_submodules()
    _plain_codegen(gm)
    _plain_sizes(gm)
    gm.recompile()
    return portable


def _plain_sizes(gm: fx.GraphModule) -> None:
    """``aten.sym_size.int(x, d)`` -> ``x.size(d)``: a graph over a shape range reads its
    dynamic sizes on every call, and the op dispatcher costs ~1 us each where the method
    costs ~0.1 us (torch.export and torch.compile trace both the same)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.sym_size.int:
            node.op, node.target = "call_method", "size"


def _plain_codegen(gm: fx.GraphModule) -> None:
    """Call the graph with plain positional tensors when the signature allows it.

    Export's pytree codegen flattens inputs and rebuilds outputs on every call (~40 us on this
    CPU); for ``forward(*tensors) -> tensor | tuple[tensor, ...]`` it is pure overhead.
    """
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is None:
        return
    in_spec, out_spec = info.in_spec, info.out_spec
    args_spec, kwargs_spec = in_spec.children() if in_spec.num_children == 2 else (None, None)
    if args_spec is None or kwargs_spec.num_children or \
            not all(c.is_leaf() for c in args_spec.children()):
        return
    single = out_spec.is_leaf()
    if not single and not (out_spec.type is tuple
                           and all(c.is_leaf() for c in out_spec.children())):
        return
    output = next(n for n in gm.graph.nodes if n.op == "output")
    if single:
        (values,) = output.args
        output.args = (values[0],)
    gm.graph._codegen = fx.graph.CodeGen()
