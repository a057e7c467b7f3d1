"""Which ops a graph read from a file may call: ``graphopt.load``'s allow-list (issue 30).

Why: a ``.pt2`` graph names its ops, and ATen has ops that do more than compute:
``aten.from_file`` maps a file the archive names (``fill_`` on it writes that file), ``set_``
and ``as_strided`` point a tensor at bytes the file chooses, ``_copy_from`` writes an argument
its schema does not declare. So an op is read only when it is computation, decided by rules
kept here as data (:func:`refusal`; ``tests/test_pt2_trust.py`` prints the decision for every
op this torch registers):

1. graphopt's own ops (:data:`GRAPHOPT_OPS`), which check their arguments;
2. an ATen op that is in torch's computing opset (tagged ``core``, a composite of other ATen
   ops, or a public op torch's decomposition table lowers to them) or in :data:`ADDED` (what
   export writes beyond it), and that is not :data:`DENIED` by name or prefix (nor a gradient
   kernel), takes and returns values only (no storage, stream or object), is no ``out=``
   variant, writes only its own ``self`` (an in-place op whose functional twin is allowed)
   and, if it returns nothing, is a check (:data:`CHECKS`);
3. a model library's op (a namespace torch does not own, registered by a module the user
   imported, which is that library's code, not the file's) that writes none of its arguments.

What an allowed op may write is checked on the built graph (:mod:`.pt2_writes`); an op that
returns uninitialized memory (:data:`UNINITIALIZED`) is zero-filled there, so no byte of the
process's heap reaches an output. The list is not a proof that every allowed kernel checks its
arguments: the test calls each allowed op on small tensors in a child process, and the ops
that crashed there are refused here (``native_batch_norm``, the gradient kernels, torch's
private decomposed kernels such as ``_batch_norm_no_update``).
"""

from __future__ import annotations

import functools

import torch
from torch._decomp import decomposition_table

__all__ = ["ADDED", "CHECKS", "DENIED", "GRAPHOPT_OPS", "RETURNS_INPUT", "TORCH_NAMESPACES",
           "UNINITIALIZED", "Refused", "qualified", "refusal", "returns_input", "written_args"]


class Refused(Exception):
    """A file's graph calls an op, or writes a tensor, that a loaded graph may not."""


#: graphopt's own ops: each checks its tensors (:mod:`.quant_checks`) before its kernel runs
GRAPHOPT_OPS = frozenset({"int8_linear", "fp8_linear", "int8_dynamic_linear",
                          "int8_weight_only_linear", "int4_linear", "int4_linear_saved"})

_FILES = "reads, creates or overwrites the file whose path it is given"
_STORAGE = "points a tensor at bytes the file chooses (a storage, sizes, strides, an offset)"
_RESIZE = "resizes a tensor's memory in place (new bytes are uninitialized)"
_KERNEL = ("a low-bit kernel that does not check its arguments; graphopt calls it only "
           "inside its own ops")
_UNSAFE = "indexes without bounds checks (meant for compilers that prove the bounds)"
#: ATen base names refused whatever the rules say, each with why
DENIED: dict[str, str] = {
    "from_file": _FILES,
    **dict.fromkeys(("set_", "set", "set_data", "as_strided", "as_strided_", "as_strided_copy",
                     "as_strided_scatter", "_reshape_alias", "_reshape_alias_copy"), _STORAGE),
    **dict.fromkeys(("resize", "resize_", "resize_as", "resize_as_", "_resize_output",
                     "_resize_output_", "_copy_from_and_resize"), _RESIZE),
    "_copy_from": "writes into its dst argument, which its schema does not declare",
    "_index_put_impl_": "index_put_ with its checks optional (a graph calls index_put_)",
    **dict.fromkeys(("_unsafe_index", "_unsafe_index_put", "_unsafe_masked_index",
                     "_unsafe_masked_index_put_accumulate"), _UNSAFE),
    "record_stream": "CUDA stream bookkeeping, not computation",
    "_print": "writes to the process's output",
    "_backward": "runs autograd, which writes the .grad of tensors it reaches",
    "item": "a Python number from a tensor: a saved graph reads one with _local_scalar_dense",
    **dict.fromkeys(("native_batch_norm", "_native_batch_norm_legit",
                     "_native_batch_norm_legit_functional"),
                    "a training batch norm (its schema hides what it writes; absent statistics "
                    "crash it); an inference graph calls _native_batch_norm_legit_no_training"),
    **dict.fromkeys(("_weight_int8pack_mm", "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu",
                     "_weight_int4pack_mm_with_scales_and_zeros", "_convert_weight_to_int4pack",
                     "_convert_weight_to_int4pack_for_cpu", "_dyn_quant_matmul_4bit",
                     "_dyn_quant_pack_4bit_weight", "_int_mm", "_scaled_mm", "_scaled_mm_v2",
                     "_scaled_grouped_mm", "_scaled_grouped_mm_v2"), _KERNEL),
}
_NESTED = "nested tensors are views at offsets and strides the file chooses"
_SPARSE = "sparse tensors index memory with indices nothing checks"
_PACKED = "reads a tensor's bytes as a pointer to a packed weight object"
#: ATen name prefixes refused, each with why
DENIED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("_nested", _NESTED), ("nested_", _NESTED),
    ("_sparse", _SPARSE), ("sparse_", _SPARSE), ("_to_sparse", _SPARSE), ("to_sparse", _SPARSE),
    ("_foreach_", "writes lists of tensors (an optimizer's step)"),
    ("_fused_", "an optimizer's step: writes lists of tensors"),
    ("_amp_", "mixed-precision training state"),
    ("_fw_primal", "forward-mode autograd state"), ("_make_dual", "forward-mode autograd state"),
    ("_unpack_dual", "forward-mode autograd state"),
    ("_cufft_", "cuFFT's plan cache: process state"),
    ("_make_per_", "a quantized tensor over raw bytes"),
    ("_empty_", "an uninitialized quantized tensor"),
    ("_test_", "torch's own tests"),
    ("fbgemm_", _PACKED), ("_wrapped_", _PACKED), ("quantized_", _PACKED),
    ("_sobol_engine", "indexes its state tensor at positions the caller gives"),
    ("_add_batch_dim", "vmap's batching state"), ("_remove_batch_dim", "vmap's batching state"),
)
#: ATen ops beyond torch's computing opset that export writes (graphopt's saved graphs and
#: the data-dependent shapes of export's IR), all pure computation
ADDED = frozenset({
    "_assert_tensor_metadata", "_assert_scalar", "_assert_async", "_functional_assert_async",
    "_functional_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size",
    "_functional_sym_constrain_range", "_functional_sym_constrain_range_for_size",
    "_make_dep_token", "_local_scalar_dense", "lift_fresh_copy", "histc", "bincount",
    "searchsorted", "kthvalue", "median", "nanmedian", "mode", "cummax", "cummin",
    "logcumsumexp", "max", "min", "masked_select", "nonzero_static", "_unique2", "_unique",
    "unique_consecutive", "equal", "allclose", "_conj", "_conj_physical", "_neg_view", "angle",
    "polygamma", "_aminmax", "__lshift__", "__rshift__", "_add_relu", "_convolution", "_fft_c2c",
    "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa", "_trilinear", "bmm", "mm",
    "_unsafe_view"})
#: ops whose result may be an argument, or a view of one, though their schema does not mark
#: it (found by calling each allowed op: ``tests/test_pt2_trust.py``), besides those torch tags
#: ``maybe_aliasing_or_mutating``: a write to their result may write their argument
RETURNS_INPUT = frozenset({
    "_unsafe_view", "unsafe_chunk", "unsafe_split", "unsafe_split_with_sizes", "type_as", "data",
    "lift", "to_dense", "sum_to_size", "atleast_1d", "atleast_2d", "atleast_3d",
    "broadcast_tensors", "flatten_dense_tensors", "_to_cpu", "pin_memory",
    "_saturate_weight_to_fp16", "_autocast_to_full_precision", "_autocast_to_reduced_precision",
    "_cast_Byte", "_cast_Char", "_cast_Double", "_cast_Float", "_cast_Half", "_cast_Int",
    "_cast_Long", "_cast_Short"})
#: ops that return nothing and are checks (a false one raises): the only ones allowed
CHECKS = frozenset({"_assert_tensor_metadata", "_assert_scalar", "_assert_async",
                    "sym_constrain_range", "sym_constrain_range_for_size"})
#: ops that return uninitialized memory: zero-filled where a file's graph calls them
UNINITIALIZED = frozenset({"empty", "empty_like", "new_empty", "empty_strided",
                           "new_empty_strided", "empty_permuted"})
#: namespaces torch registers itself (its internals, distributed, quantized engines): a file
#: may not call their ops; any other but ``graphopt`` is a model library's
TORCH_NAMESPACES = frozenset({
    "aten", "prims", "quantized", "_quantized", "symm_mem", "static_runtime", "c10d", "onednn",
    "_c10d_functional", "_c10d_functional_autograd", "mkldnn", "mkldnn_prepacked", "mkl",
    "sparse", "inductor", "inductor_prims", "profiler", "_test", "quantization", "debugprims",
    "rngprims", "_native", "debug_mode_ops", "export", "_dtensor", "higher_order", "fbgemm"})
#: argument and return types of an op that computes (after Optional[] and List[])
_VALUES = frozenset({"Tensor", "int", "SymInt", "bool", "number", "float", "complex",
                     "ScalarType", "str", "Device", "Layout", "MemoryFormat", "Generator"})
#: arguments some batch norms write without declaring it (their running statistics)
_UNDECLARED = ("running_mean", "running_var")


def returns_input(op: torch._ops.OpOverload) -> bool:
    """Whether ``op``'s result may share memory with an argument its schema does not mark:
    :data:`RETURNS_INPUT`, an op torch tags so, or a library's op (graphopt's never do)."""
    if op.namespace == "graphopt":
        return False
    return op.namespace != "aten" or op._schema.name.split("::")[1] in RETURNS_INPUT or \
        torch.Tag.maybe_aliasing_or_mutating in op.tags


def _base(t: torch._C.JitType) -> str:
    while t.kind() in ("OptionalType", "ListType"):
        t = t.getElementType()
    return str(t)


def written_args(op: torch._ops.OpOverload) -> tuple[str, ...]:
    """The arguments ``op`` may write: declared (``Tensor(a!)``) or a batch norm's running
    statistics (written when training, undeclared by some schemas)."""
    return tuple(a.name for a in op._schema.arguments
                 if (a.alias_info is not None and a.alias_info.is_write)
                 or (a.name in _UNDECLARED and op.namespace == "aten"))


@functools.cache
def _dispatched() -> frozenset[str]:
    """Every op the dispatcher has (``aten::add.Tensor``); TorchScript's scalar builtins that
    ``torch.ops.aten`` also resolves (``aten::ldexp(float, int)``) are not among them."""
    return frozenset(torch._C._dispatch_get_all_op_names())


def qualified(op: torch._ops.OpOverload) -> str:
    """``aten::add.Tensor``, ``aten::from_file``: the op as its error names it."""
    schema = op._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


def _opset(op: torch._ops.OpOverload) -> bool:
    """In torch's computing opset: core ATen, a composite of other ATen ops, a public op
    torch decomposes into those (its private kernels trust their callers:
    ``_batch_norm_no_update`` crashes on absent statistics), or ADDED."""
    base = op._schema.name.split("::")[1]
    return (torch.Tag.core in op.tags or base in ADDED
            or (op in decomposition_table and not base.startswith("_"))
            or torch._C._dispatch_has_kernel_for_dispatch_key(qualified(op),
                                                              "CompositeImplicitAutograd"))


def _aten_refusal(op: torch._ops.OpOverload) -> str | None:
    base = op._schema.name.split("::")[1]
    if qualified(op) not in _dispatched():
        return "not an op of torch's dispatcher (a TorchScript builtin)"
    if base in DENIED:
        return DENIED[base]
    if "backward" in base:
        return ("a gradient kernel: an inference graph never calls one, and they trust their "
                "callers (smooth_l1_loss_backward divides by zero on an empty input)")
    prefix = next((why for p, why in DENIED_PREFIXES if base.startswith(p)), None)
    if prefix is not None:
        return prefix
    schema = op._schema
    if torch.Tag.out in op.tags or any(a.is_out for a in schema.arguments):
        return "writes its result into a tensor it is handed (an out= variant)"
    odd = sorted({_base(a.real_type) for a in (*schema.arguments, *schema.returns)} - _VALUES)
    if odd:
        return f"takes or returns {', '.join(odd)}, not tensors and values"
    writes = tuple(w for w in written_args(op) if w not in _UNDECLARED)  # pt2_writes checks
    if writes and (writes != ("self",) or not base.endswith("_")):
        return f"writes its argument(s) {', '.join(writes)}"
    if writes:  # an in-place op: allowed where its functional twin is
        twin = getattr(getattr(torch.ops.aten, base[:-1], None), op._overloadname, None)
        if not isinstance(twin, torch._ops.OpOverload) or _aten_refusal(twin) is not None:
            return f"an in-place op whose functional form {base[:-1]} is not allowed"
        return None
    if not schema.returns and base not in CHECKS:
        return "returns nothing: it is called for a side effect"
    if not _opset(op):
        return ("not in the ATen opset a saved graph is read with (core ATen, torch's "
                "decompositions and composites, and what export writes)")
    return None


def refusal(op: torch._ops.OpOverload) -> str | None:
    """Why a graph read from a file may not call ``op``, or None where it may."""
    ns = op.namespace
    if ns == "graphopt":
        name = op._schema.name.split("::")[1]
        return None if name in GRAPHOPT_OPS else "not one of graphopt's own ops"
    if ns == "aten":
        return _aten_refusal(op)
    if ns in TORCH_NAMESPACES:
        return f"an op of torch's own {ns} namespace, which a saved graph never calls"
    writes = written_args(op)
    return f"a model library's op that writes its argument(s) {', '.join(writes)}" \
        if writes else None
