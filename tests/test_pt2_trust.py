"""Issue 30, items 1 and 2: a graph ``graphopt.load`` reads from a file only computes.

Written as an attacker hits it: a real saved archive whose JSON graph is edited (nodes added,
re-zipped) to call ``aten.from_file`` (which maps a file the archive names: ``fill_`` on it
overwrites that file, or its bytes flow into the outputs), to write the caller's own input in
place, or to write a cache buffer whose strides put two elements at one address. Each is a
GraphoptError at load, naming the op or the tensor, before anything runs; a saved KV-cache step
(a buffer written in place) still loads and runs. Then the allow-list itself
(``graphopt/backends/torch/pt2_ops.py``): every op this torch registers is decided, no op that
reaches files, storage or raw memory is allowed, every op graphopt's saved graphs hold is, and
every allowed op, called on small tensors in a child process, neither crashes nor returns its
argument's memory where neither its schema nor the list says it may.
"""

from __future__ import annotations

import collections
import copy
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import graphopt
from graphopt.backends.torch import pt2_ops
from graphopt.backends.torch.pt2_writes import overlaps
from tests.test_save_load import _convnet
from tests.test_trust_load import _edit_json as edit_json
from tests.test_trust_load import _rewrite

ROOT = Path(__file__).resolve().parents[1]
X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small valid file, fp32 on this CPU (the same numbers on any host)."""
    opt = graphopt.optimize(_convnet(), X, target="cpu", precision="fp32", measure=False)
    return opt.save(tmp_path_factory.mktemp("good") / "good.pt2")


def rewrite(good: Path, out: Path, edit: Callable[[str, bytes], bytes | None]) -> Path:
    """A copy of ``good`` with each member passed through ``edit(name, bytes)``."""
    return _rewrite(good, out, edit)


def tensor(name: str) -> dict[str, Any]:
    return {"as_tensor": {"name": name}}


def node(target: str, out: str, *args: tuple[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A serialized node: positional ``(name, arg)`` inputs, keyword ones by name."""
    inputs = [{"name": n, "arg": a, "kind": 1} for n, a in args]
    inputs += [{"name": n, "arg": a, "kind": 2} for n, a in kwargs.items()]
    return {"target": f"torch.ops.aten.{target}", "inputs": inputs,
            "outputs": [tensor(out)], "metadata": {}, "is_hop_single_tensor_return": None,
            "name": out}


OUTPUT = "<the graph's output>"  # a name in ``nodes`` that poison() replaces with the real one


def poison(nodes: list[dict[str, Any]], last: str, add: bool = False
           ) -> Callable[[Any], None]:
    """An edit of the program: ``nodes`` appended, ``last`` wired into the first output (as
    ``output + sum(last) * 0``, or ``output + last`` with ``add``), so nothing is dead code."""
    def change(program: dict[str, Any]) -> None:
        graph = program["graph_module"]["graph"]
        out = graph["outputs"][0]["as_tensor"]["name"]
        nodes_here = json.loads(json.dumps(nodes).replace(json.dumps(OUTPUT), json.dumps(out)))
        tail = [] if add else [
            node("_to_copy.default", "stolen_f", ("self", tensor(last)),
                 dtype={"as_scalar_type": 7}),
            node("sum.default", "stolen_sum", ("self", tensor("stolen_f"))),
            node("mul.Tensor", "stolen_zero", ("self", tensor("stolen_sum")),
                 ("other", {"as_float": 0.0}))]
        term = last if add else "stolen_zero"
        graph["nodes"] += [*nodes_here, *tail, node("add.Tensor", "poisoned", ("self", tensor(out)),
                                                ("other", tensor(term)))]
        graph["outputs"][0] = tensor("poisoned")
    return change


def crafted(good: Path, out: Path, nodes: list[dict[str, Any]], last: str,
            add: bool = False) -> Path:
    return rewrite(good, out, edit_json("models/model.json", poison(nodes, last, add)))


def from_file(path: Path, shared: bool, out: str = "mapped") -> dict[str, Any]:
    return node("from_file.default", out, ("filename", {"as_string": str(path)}),
                ("shared", {"as_bool": shared}), ("size", {"as_int": 64}),
                dtype={"as_scalar_type": 1})


# --- from_file: a file that reads or writes any file ---------------------------------------------
def _refused(path: Path | str, op: str, *call: torch.Tensor) -> graphopt.GraphoptError:
    """The GraphoptError ``graphopt.load(path)`` raises, naming ``op``; if it loads, the
    module is called (what the attacker waits for) and the test fails."""
    try:
        module = graphopt.load(path)
    except graphopt.GraphoptError as e:
        assert op in e.problem, e.problem
        assert "only computes" in e.fix
        return e
    module(*call)
    pytest.fail(f"graphopt.load accepted {path}, and calling it ran what the file asked")


def test_a_file_cannot_overwrite_or_create_a_file(good: Path, tmp_path: Path) -> None:
    victim, marker = tmp_path / "victim.txt", tmp_path / "created_by_the_file"
    victim.write_bytes(b"the user's own file\n")
    before = victim.read_bytes()
    for target, name in ((victim, "overwrite"), (marker, "create")):
        filled = node("fill_.Scalar", "filled", ("self", tensor("mapped")),
                      ("value", {"as_int": 65}))
        path = crafted(good, tmp_path / f"{name}.pt2", [from_file(target, True), filled], "filled")
        error = _refused(path, "aten::from_file", X)
        assert "reads, creates or overwrites the file" in error.problem
    assert victim.read_bytes() == before
    assert not marker.exists()


def test_a_file_cannot_read_a_file_into_its_outputs(good: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.key"
    secret.write_bytes(bytes(range(64)))
    path = crafted(good, tmp_path / "read.pt2", [from_file(secret, False)], "mapped")
    _refused(path, "aten::from_file", X)
    assert secret.read_bytes() == bytes(range(64))


def test_a_deploy_folder_is_refused_the_same(good: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"unchanged")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "deploy.json").write_text(json.dumps({"artifact": "torch", "file": "model.pt2"}))
    filled = node("fill_.Scalar", "filled", ("self", tensor("mapped")), ("value", {"as_int": 0}))
    crafted(good, folder / "model.pt2", [from_file(victim, True), filled], "filled")
    _refused(folder, "aten::from_file", X)
    assert victim.read_bytes() == b"unchanged"


@pytest.mark.parametrize("op, target, why", [
    ("set_", "set_.source_Tensor", "points a tensor at bytes"),
    ("as_strided", "as_strided.default", "points a tensor at bytes"),
    ("resize_", "resize_.default", "resizes a tensor's memory"),
])
def test_storage_ops_are_refused(good: Path, tmp_path: Path, op: str, target: str,
                                 why: str) -> None:
    args = {"set_": [("self", tensor("clone")), ("source", tensor("x"))],
            "as_strided": [("self", tensor("clone")), ("size", {"as_ints": [64]}),
                           ("stride", {"as_ints": [1]})],
            "resize_": [("self", tensor("clone")), ("size", {"as_ints": [1 << 20]})]}[op]
    nodes = [node("clone.default", "clone", ("self", tensor("x"))), node(target, "bad", *args)]
    error = _refused(crafted(good, tmp_path / f"{op}.pt2", nodes, "bad"), f"aten::{op}", X)
    assert why in error.problem


# --- in-place writes ----------------------------------------------------------------------------
_VIA = {  # how the file reaches the caller's input x before writing it
    "directly": ([], "x"),
    "through _unsafe_view": ([node("_unsafe_view.default", "flat", ("self", tensor("x")),
                                   ("size", {"as_ints": [2, 192]}))], "flat"),
    "through type_as": ([node("type_as.default", "same", ("self", tensor("x")),
                              ("other", tensor("x")))], "same"),
    "through a transpose": ([node("transpose.int", "swapped", ("self", tensor("x")),
                                  ("dim0", {"as_int": 2}), ("dim1", {"as_int": 3}))],
                            "swapped"),
}


@pytest.mark.parametrize("via", sorted(_VIA))
def test_an_in_place_write_to_the_callers_input_is_refused(good: Path, tmp_path: Path,
                                                           via: str) -> None:
    nodes, target = _VIA[via]
    write = node("mul_.Scalar", "doubled", ("self", tensor(target)), ("other", {"as_float": 2.0}))
    path = crafted(good, tmp_path / "write.pt2", [*nodes, write], "doubled")
    x = X.clone()
    error = _refused(path, "aten::mul_.Scalar", x)
    assert "the model's input x" in error.problem
    assert torch.equal(x, X)


def member(path: Path, suffix: str) -> Any:
    """The JSON member of ``path`` whose name ends with ``suffix``."""
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read(next(n for n in z.namelist() if n.endswith(suffix))))


def test_an_in_place_write_to_a_weight_is_refused(good: Path, tmp_path: Path) -> None:
    config = member(good, "model_weights_config.json")
    weight = next(k for k, v in config["config"].items() if v["is_param"])
    program = member(good, "models/model.json")
    arg = next(s["parameter"]["arg"]["name"] for s in
               program["graph_module"]["signature"]["input_specs"]
               if "parameter" in s and s["parameter"]["parameter_name"] == weight)
    write = node("zero_.default", "zeroed", ("self", tensor(arg)))
    error = _refused(crafted(good, tmp_path / "w.pt2", [write], "zeroed"), "aten::zero_", X)
    assert f"the weight {weight}" in error.problem


class Cache(nn.Module):
    """A static KV cache's step: the new position written into two buffers in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(2, 8, 4))
        self.register_buffer("values", torch.zeros(2, 8, 4))
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.keys.index_copy_(1, pos, self.proj(x))
        self.values[:, pos] = x
        return (self.keys * self.values).sum(1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Cache]:
    torch.manual_seed(0)
    model = Cache().eval()
    args = (torch.randn(2, 1, 4), torch.tensor([3]))
    opt = graphopt.optimize(copy.deepcopy(model), args, target="cpu", precision="fp32",
                            measure=False)
    return opt.save(tmp_path_factory.mktemp("cache") / "cache.pt2"), model


def test_a_saved_kv_cache_step_loads_and_writes_its_buffers(cache: tuple[Path, Cache]) -> None:
    path, model = cache
    loaded, eager = graphopt.load(path), copy.deepcopy(model)
    code = loaded.graph_module.code
    assert "index_copy_" in code and "index_put_" in code
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for pos in (3, 5, 3):
            x, at = torch.randn(2, 1, 4, generator=g), torch.tensor([pos])
            torch.testing.assert_close(loaded(x, at), eager(x, at), rtol=1e-6, atol=1e-6)
    assert torch.equal(loaded.graph_module.keys, eager.keys)  # the buffer kept each step


def _weights_edit(change: Callable[[dict[str, Any]], None]) -> Callable[[str, bytes], bytes]:
    return edit_json("model_weights_config.json", lambda cfg: change(cfg["config"]))


def test_a_written_buffer_must_own_its_bytes(cache: tuple[Path, Cache], tmp_path: Path) -> None:
    """A cache buffer declared with zero strides (every position one address), or over the
    other buffer's file (each write lands in both): refused at load, naming the buffer."""
    path, _ = cache

    def zero_strides(config: dict[str, Any]) -> None:
        config["keys"]["tensor_meta"]["strides"] = [{"as_int": 0}] * 3

    def shared(config: dict[str, Any]) -> None:
        config["values"]["path_name"] = config["keys"]["path_name"]

    for edit, said in ((zero_strides, "two of its elements at one address"),
                       (shared, "shares its bytes with")):
        bad = rewrite(path, tmp_path / "bad.pt2", _weights_edit(edit))
        error = _refused(bad, "writes the buffer", torch.randn(2, 1, 4), torch.tensor([3]))
        assert said in error.problem and ("keys" in error.problem or "values" in error.problem)


def test_uninitialized_memory_is_zeroed_before_it_is_read(good: Path, tmp_path: Path) -> None:
    """``empty_like`` (a MoE's routing fills one in) added to the output: the loaded graph
    zero-fills it, so the output is the model's and no byte of the heap leaks out."""
    want = graphopt.load(good)(X)
    empty = node("empty_like.default", "heap", ("self", tensor(OUTPUT)))
    module = graphopt.load(crafted(good, tmp_path / "empty.pt2", [empty], "heap", add=True))
    heap = next(n for n in module.graph_module.graph.nodes
                if n.target is torch.ops.aten.empty_like.default)
    assert [u.target for u in heap.users] == [torch.ops.aten.zero_.default]
    assert torch.equal(module(X), want)


# --- the allow-list -----------------------------------------------------------------------------
#: the ops graphopt's own saved graphs hold, measured on 59 archives (tests/arch_zoo's models on
#: cpu and h100, every pass of test_save_load on the ConvNet, static and ranged, and a Llama
#: quantized fp8, int4, int8_dynamic, int8_weight_only and CPU int8)
SAVED_OPS = (
    "aten.__and__.Tensor", "aten._assert_tensor_metadata.default", "aten._to_copy.default",
    "aten.abs.default", "aten.adaptive_avg_pool2d.default", "aten.add.Tensor",
    "aten.add_.Tensor", "aten.addmm.default", "aten.alias.default", "aten.arange.default",
    "aten.cat.default", "aten.chunk.default", "aten.constant_pad_nd.default",
    "aten.contiguous.default", "aten.conv1d.default", "aten.conv2d.default", "aten.cos.default",
    "aten.cumsum.default", "aten.diff.default", "aten.div.Tensor", "aten.div_.Tensor",
    "aten.embedding.default", "aten.empty_like.default", "aten.eq.Tensor", "aten.expand.default",
    "aten.flatten.using_ints", "aten.floor_divide.default", "aten.full_like.default",
    "aten.gather.default", "aten.ge.Scalar", "aten.gelu.default", "aten.gt.Scalar",
    "aten.gt.Tensor", "aten.hardtanh.default", "aten.histc.default", "aten.index.Tensor",
    "aten.index_put_.default", "aten.layer_norm.default", "aten.le.Tensor",
    "aten.linear.default", "aten.log.default", "aten.lt.Scalar", "aten.max_pool2d.default",
    "aten.mean.dim", "aten.min.other", "aten.mul.Tensor", "aten.ne.Scalar", "aten.neg.default",
    "aten.new_ones.default", "aten.pad.default", "aten.permute.default",
    "aten.pow.Tensor_Scalar", "aten.relu.default", "aten.repeat.default", "aten.reshape.default",
    "aten.rsqrt.default", "aten.scaled_dot_product_attention.default", "aten.sigmoid.default",
    "aten.silu.default", "aten.sin.default", "aten.slice.Tensor", "aten.softmax.int",
    "aten.sort.default", "aten.split.Tensor", "aten.sub.Tensor", "aten.sum.dim_IntList",
    "aten.tanh.default", "aten.to.device", "aten.to.dtype", "aten.to.dtype_layout",
    "aten.topk.default", "aten.transpose.int", "aten.type_as.default", "aten.unsqueeze.default",
    "aten.view.default", "aten.where.ScalarOther", "aten.where.self",
    # what export writes for data-dependent and dynamic shapes, and a KV cache's step
    "aten.sym_size.int", "aten.sym_numel.default", "aten.sym_stride.int",
    "aten._local_scalar_dense.default", "aten._assert_scalar.default",
    "aten.sym_constrain_range_for_size.default", "aten._unsafe_view.default",
    "aten.index_copy_.default", "aten.copy_.default", "aten.lift_fresh_copy.default",
    "graphopt.fp8_linear.default", "graphopt.int4_linear_saved.default",
    "graphopt.int8_dynamic_linear.default", "graphopt.int8_linear.default",
    "graphopt.int8_weight_only_linear.default")
#: what no allowed op's name may contain (files, storage, raw memory, process state)
NEVER = ("from_file", "set_", "storage", "data_ptr", "as_strided", "_nested", "resize",
         "record_stream", "_print", "_foreach_", "_unsafe_index", "_sparse", "_copy_from",
         "_cufft", "_weight_int", "_int_mm", "_scaled_mm", "fbgemm", "backward")
#: allowed though their names match: a view that checks its size, and offset queries (ints)
NAMED_SO = {"aten._unsafe_view.default", "aten.storage_offset.default",
            "aten.sym_storage_offset.default"}


def _aten_ops() -> list[torch._ops.OpOverload]:
    ops = []
    for name in sorted(torch._C._dispatch_get_all_op_names()):
        if name.startswith("aten::"):
            base, _, overload = name[6:].partition(".")
            ops.append(getattr(getattr(torch.ops.aten, base), overload or "default"))
    return ops


def _op(name: str) -> torch._ops.OpOverload:
    ns, base, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), base), overload)


def test_every_registered_op_is_decided_and_no_file_or_memory_op_is_allowed() -> None:
    decided: dict[str, str | None] = {str(op): pt2_ops.refusal(op) for op in _aten_ops()}
    assert len(decided) > 3000
    allowed = sorted(k for k, why in decided.items() if why is None)
    reasons = collections.Counter(why.split(":")[0][:70] for why in decided.values() if why)
    print(f"\n{len(allowed)} of {len(decided)} ATen ops allowed; refused:")
    for why, count in reasons.most_common():
        print(f"  {count:5d}  {why}")
    leaked = [op for op in allowed for bad in NEVER if bad in op and op not in NAMED_SO]
    assert leaked == []
    assert all(torch.Tag.out not in _op(op).tags for op in allowed)
    for op in ("from_file.default", "_unsafe_index.Tensor", "_batch_norm_no_update.default",
               "native_batch_norm.default", "item.default", "_copy_from.default",
               "set_.source_Storage", "record_stream.default"):
        assert decided[f"aten.{op}"] is not None, op
    refused = {op: pt2_ops.refusal(_op(op)) for op in SAVED_OPS}
    assert {op: why for op, why in refused.items() if why} == {}


def test_torchs_own_namespaces_are_refused_and_libraries_are_not() -> None:
    """Every namespace a process with only torch and graphopt has is torch's (its ops are
    refused) or graphopt's; a model library's op is allowed unless it writes its arguments."""
    code = ("import torch, graphopt.backends.torch.load\n"
            "print(sorted({n.split('::')[0] for n in torch._C._dispatch_get_all_op_names()}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True, timeout=300)
    namespaces = set(json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"')))
    assert namespaces - {"graphopt"} <= pt2_ops.TORCH_NAMESPACES
    assert "torch's own" in pt2_ops.refusal(torch.ops._c10d_functional.all_reduce.default)
    lib = torch.library.Library("trusttest", "FRAGMENT")  # noqa: F841 - kept alive
    lib.define("pure(Tensor x) -> Tensor")
    lib.define("writes(Tensor(a!) x) -> Tensor(a!)")
    assert pt2_ops.refusal(torch.ops.trusttest.pure.default) is None
    assert "writes its argument" in pt2_ops.refusal(torch.ops.trusttest.writes.default)


# every allowed op whose required arguments this can fill, on small tensors of a few dtypes:
# prints a line per op that crashes (the last CALL line names it) or returns memory of an
# argument, or writes one, where neither its schema nor pt2_ops says it may
_PROBE = """
import torch, warnings
warnings.simplefilter("ignore")
from graphopt.backends.torch import pt2_ops
import tests.test_pt2_trust as t

def fill(a, x, k):
    kind = str(a.type)
    return {"Tensor": x, "int": (0, 1, 2)[k], "SymInt": (0, 1, 2)[k], "float": (0.0, .5, 1.)[k],
            "bool": (False, True, False)[k], "List[int]": (list(x.shape), [16], [0])[k],
            "List[SymInt]": (list(x.shape), [16], [0])[k], "Scalar": 1, "ScalarType": x.dtype,
            "List[Tensor]": [x], "Optional[Tensor]": None}[kind]

def storages(v):
    if isinstance(v, torch.Tensor) and v.numel():
        yield v.untyped_storage().data_ptr()
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from storages(x)

for op in t._aten_ops():
    if pt2_ops.refusal(op) is not None or op._schema.name[6:] in pt2_ops.UNINITIALIZED:
        continue
    schema = op._schema
    req = [a for a in schema.arguments if not a.has_default_value() and not a.kwarg_only]
    if not any(str(a.type) in ("Tensor", "List[Tensor]") for a in req):
        continue
    marked = any(a.alias_info is not None for a in schema.arguments)
    for dtype in (torch.float32, torch.int64, torch.bool, torch.complex64, torch.float16):
        for k in range(3):
            x = torch.ones(4, 4, dtype=dtype)
            try:
                args = [fill(a, x, k) for a in req]
            except KeyError:
                continue
            print("CALL", op, flush=True)
            try:
                out = op(*args)
            except Exception:
                continue
            shares = set(storages(out)) & set(storages(args))
            if shares and not marked and not pt2_ops.returns_input(op):
                print("ALIAS", op, flush=True)
            if not torch.equal(x, torch.ones(4, 4, dtype=dtype)) and not marked and \\
                    not pt2_ops.written_args(op):
                print("WRITES", op, flush=True)
print("DONE")
"""


@pytest.mark.slow
def test_every_allowed_op_computes_without_crashing_or_aliasing_unsaid() -> None:
    """Called in a child process (a kernel that trusts its caller may crash it): no allowed
    op crashes on small tensors, and every one whose result shares an argument's memory (a
    write to it would write the argument) is marked in its schema or in RETURNS_INPUT."""
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          cwd=ROOT, check=False, timeout=600)
    lines = done.stdout.splitlines()
    last = next((ln for ln in reversed(lines) if ln.startswith("CALL")), "")
    assert done.returncode == 0 and lines[-1] == "DONE", \
        f"exit {done.returncode} at {last}: deny that op in pt2_ops ({done.stderr[-300:]})"
    assert [ln for ln in lines if ln.startswith(("ALIAS", "WRITES"))] == []
    assert sum(ln.startswith("CALL") for ln in lines) > 1000


def test_overlap_is_decided_by_strides() -> None:
    assert not overlaps((2, 8, 4), (32, 4, 1)) and not overlaps((4, 2), (1, 4))
    assert overlaps((2, 8, 4), (0, 4, 1)) and overlaps((3, 3), (1, 1))
    assert not overlaps((1, 5), (0, 1)) and not overlaps((0, 5), (0, 0))
