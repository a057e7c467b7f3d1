"""graphopt's own ``.pt2`` reader (graphopt/backends/torch/pt2_reader.py): ``graphopt.load`` builds
the module
from the archive's JSON without torch.export.load, the same module torch's path gives (code,
weights, outputs bit for bit), and refuses anything it does not read with a GraphoptError that
names it (it never hands a file to torch.export.load, which unpickles). torch's path is the
trusted reference here, on files these tests wrote themselves.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

import graphopt
from graphopt.backends.torch import pt2_reader
from tests.test_save_load import PASSES, Tokens, _convnet

_EXTRAS = ("graphopt_format.json", "graphopt_plan.json", "graphopt_runtime.json",
           "graphopt_inputs.json", "graphopt_outputs.json")


def plain_module(ep: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """The reference: ``ep``'s own graph with each weight placeholder unlifted to an attribute
    (what the reader builds), or ``ep.module()`` for a structured output."""
    from torch.export.graph_signature import InputKind

    sig, gm, out_spec = ep.graph_signature, ep.graph_module, ep.call_spec.out_spec
    if not (out_spec.is_leaf() or (out_spec.type is tuple and all(
            c.is_leaf() for c in out_spec.children()))):
        module = ep.module(check_guards=False)
        module._forward_pre_hooks.clear()
        module._forward_hooks.clear()
        return module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for node, spec in zip(placeholders, sig.input_specs, strict=True):
        if spec.kind is InputKind.USER_INPUT:
            continue
        persistent = spec.kind is InputKind.PARAMETER or (
            spec.kind is InputKind.BUFFER and spec.persistent)
        value = ep.state_dict[spec.target] if persistent else ep.constants[spec.target]
        name = "_".join(str(spec.target).split("."))
        if isinstance(value, torch.nn.Parameter):
            gm.register_parameter(name, value)
        else:
            gm.register_buffer(name, value, persistent=persistent)
        with gm.graph.inserting_before(first_op):
            attr = gm.graph.get_attr(name)
        attr.meta = node.meta
        node.replace_all_uses_with(attr)
        gm.graph.erase_node(node)
    if out_spec.is_leaf():  # the model returns one tensor, not a 1-tuple
        output = next(n for n in gm.graph.nodes if n.op == "output")
        output.args = (output.args[0][0],)
    return gm


def export_load(path: Path, extra: dict[str, Any], device: Any = None) -> Any:
    """torch's own path, trusted on the files these tests wrote: torch.export.load, moved."""
    ep = torch.export.load(path, extra_files=extra)
    if device is not None:
        from torch.export.passes import move_to_device_pass

        ep = move_to_device_pass(ep, torch.device(device))
    return plain_module(ep)


def _load_by_reader(path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    """graphopt.load(path), with torch.export.load made to fail: the reader reads it alone."""
    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("graphopt.load called torch.export.load")

    with monkeypatch.context() as m:
        m.setattr(torch.export, "load", refuse)
        return graphopt.load(path, **kw)


def _load_by_torch(path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    """graphopt.load(path) with the graph built by torch's path instead of the reader."""
    calls = []

    def torch_path(file: Path, archive: Any, extra: dict[str, Any], device: Any,
                   compile: bool = True) -> Any:
        calls.append(file)
        return export_load(file, extra, device)

    with monkeypatch.context() as m:
        m.setattr(pt2_reader, "build", torch_path)
        module = graphopt.load(path, **kw)
    assert calls  # it did take torch's path
    return module


def _state(module: torch.nn.Module) -> dict[str, tuple[Any, ...]]:
    gm = module.graph_module
    persistent = set(gm.state_dict(keep_vars=True))
    return {k: (type(v), v.dtype, tuple(v.shape), v.stride(), v.storage_offset(),
                v.requires_grad, v.device, k in persistent, v.detach().clone())
            for k, v in [*gm.named_parameters(), *gm.named_buffers()]}


def _same_module(got: Any, want: Any, calls: list[tuple[torch.Tensor, ...]],
                 same_code: bool = True) -> None:
    assert got.graph_module.code == want.graph_module.code or not same_code
    a, b = _state(got), _state(want)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k][:-1] == b[k][:-1], k
        assert torch.equal(a[k][-1], b[k][-1]), k
    assert got.plan == want.plan and got._runtime == want._runtime
    assert got.runtime_settings == want.runtime_settings
    assert got._input_shapes == want._input_shapes and got._input_names == want._input_names
    with torch.no_grad():
        for args in calls:
            x, y = got(*args), want(*args)
            assert x.dtype == y.dtype and torch.equal(x, y)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(PASSES))
@pytest.mark.parametrize("ranged", [False, True], ids=["static", "range"])
def test_reader_reads_every_pass(case: str, ranged: bool, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    options, applied = PASSES[case]
    dyn = ({0: torch.export.Dim("batch", min=1, max=8)},) if ranged else None
    opt = graphopt.optimize(_convnet(), torch.randn(4, 3, 8, 8), measure=False,
                            dynamic_shapes=dyn, **options)
    assert applied in opt.info.passes_applied, opt.info.passes_reverted
    path = opt.save(tmp_path / f"{case}.pt2")
    assert pt2_reader.read(path, {}) is not None
    got = _load_by_reader(path, monkeypatch)
    calls = [(torch.randn(b, 3, 8, 8),) for b in ((1, 3, 4, 8) if ranged else (4, 4))]
    _same_module(got, _load_by_torch(path, monkeypatch), calls)
    with torch.no_grad():
        assert torch.equal(got(*calls[0]), opt.module(*calls[0]))
    targets = {str(n.target) for n in got.graph_module.graph.nodes}
    if case == "int8":  # re-packed at load as on torch's path
        assert "quantized.linear_dynamic.default" in targets


@pytest.mark.parametrize("ranged", [False, True], ids=["static", "range"])
def test_reader_two_inputs_sharing_dims(ranged: bool, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    seq = torch.export.Dim("seq", min=2, max=64)
    dyn = ({0: batch, 1: seq}, {0: batch, 1: seq}) if ranged else None
    opt = graphopt.optimize(Tokens().eval(), (torch.randn(4, 8, 16), torch.ones(4, 8)),
                            target="cpu", measure=False, dynamic_shapes=dyn)
    path = opt.save(tmp_path / "tokens.pt2")
    sizes = ((1, 2), (4, 8), (7, 33), (16, 64)) if ranged else ((4, 8), (4, 8))
    calls = [(torch.randn(b, s, 16), (torch.rand(b, s) > 0.3).float()) for b, s in sizes]
    got = _load_by_reader(path, monkeypatch)
    _same_module(got, _load_by_torch(path, monkeypatch), calls)
    if ranged:
        with pytest.raises(graphopt.GraphoptError, match="dim batch is 2 in one input and 3"):
            got(torch.randn(2, 8, 16), torch.ones(3, 8))


def test_reader_device_and_nested_weight_names(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The model copy (nested names, BatchNorm's persistent buffers, an int64 counter) and
    ``device=`` (move_to_device_pass's rewrite of baked-in devices) read the same way."""
    import graphopt.backends.torch.pipeline as pipeline

    monkeypatch.setattr(pipeline, "_slower_than_original", lambda *a: "slower (forced)")
    x = torch.randn(2, 3, 8, 8)
    opt = graphopt.optimize(_convnet(), x, target="cpu", measure=True)
    path = opt.save(tmp_path / "copy.pt2")
    got = _load_by_reader(path, monkeypatch)
    assert any("." not in k and "bn" in k for k in got.graph_module.state_dict())
    _same_module(got, _load_by_torch(path, monkeypatch), [(x,), (torch.randn(2, 3, 8, 8),)])
    path = graphopt.optimize(_convnet(), x, target="h100", pad="always",
                             measure=False).save(tmp_path / "h100.pt2")
    _same_module(_load_by_reader(path, monkeypatch, device="cpu"),
                 _load_by_torch(path, monkeypatch, device="cpu"), [(x,)])


def _edited(good: Path, out: Path, edit: Any) -> Path:
    """A copy of ``good`` with its program JSON changed by ``edit(program)``."""
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("models/model.json"):
                program = json.loads(data)
                edit(program)
                data = json.dumps(program).encode()
            dst.writestr(item, data)
    return out


def _no_kinds(program: dict[str, Any]) -> None:
    """Argument kinds left out (older writers): torch places them by the schema."""
    for node in program["graph_module"]["graph"]["nodes"]:
        for i in node["inputs"]:
            i["kind"] = None


def _newer_schema(program: dict[str, Any]) -> None:
    program["schema_version"]["minor"] += 1


def test_reader_places_arguments_without_kinds(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An older writer's file (no argument kinds) reads as torch reads it: by the schema."""
    x = torch.randn(4, 3, 8, 8)
    opt = graphopt.optimize(_convnet(), x, target="h100", pad="always", measure=False)
    good = opt.save(tmp_path / "good.pt2")
    bad = _edited(good, tmp_path / "edited.pt2", _no_kinds)
    calls = [(x,), (torch.randn(4, 3, 8, 8),)]
    _same_module(_load_by_reader(bad, monkeypatch), _load_by_torch(bad, monkeypatch), calls)
    # the same weights and outputs as the file with kinds (torch passes ``value`` by keyword)
    _same_module(_load_by_reader(bad, monkeypatch), _load_by_reader(good, monkeypatch), calls,
                 same_code=False)


def test_reader_refuses_what_it_does_not_know(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer torch.export schema is a reader limit, said as such (not "damaged"), and the
    file is not handed to torch.export.load (load_by_reader makes that call fail)."""
    opt = graphopt.optimize(_convnet(), torch.randn(4, 3, 8, 8), target="h100", pad="always",
                            measure=False)
    bad = _edited(opt.save(tmp_path / "good.pt2"), tmp_path / "edited.pt2", _newer_schema)
    with pytest.raises(graphopt.GraphoptError) as info:
        _load_by_reader(bad, monkeypatch)
    assert "does not read: torch.export schema version" in info.value.problem
    assert "damaged" not in info.value.problem
    assert "torch.export.load yourself" in info.value.fix
    with pytest.raises(graphopt.GraphoptError, match="schema version"):
        pt2_reader.read(bad, {})


def test_reader_does_not_import_dynamo(tmp_path: Path) -> None:
    path = graphopt.optimize(_convnet(), torch.randn(2, 3, 8, 8), target="cpu",
                             measure=False).save(tmp_path / "m.pt2")
    code = ("import sys, torch, graphopt\nm = graphopt.load(sys.argv[1])\n"
            "m(torch.randn(2, 3, 8, 8))\n"
            "print([k for k in sys.modules if k.startswith(('torch._dynamo', "
            "'torch._export.serde'))])")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def _nodes(gm: torch.fx.GraphModule) -> list[tuple[Any, ...]]:
    def named(a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda n: n.name)
    return [(n.name, n.op, n.target, named(n.args), named(dict(n.kwargs))) for n in gm.graph.nodes]


def test_reader_matches_plain_module(tmp_path: Path) -> None:
    """read() itself: plain_module(export_load(...))'s graph, weights and extra files."""
    opt = graphopt.optimize(_convnet(), torch.randn(4, 3, 8, 8), target="cpu",
                            quantize="int8", measure=False)
    path = opt.save(tmp_path / "m.pt2")
    mine, theirs = dict.fromkeys(_EXTRAS, ""), dict.fromkeys(_EXTRAS, "")
    got, want = pt2_reader.read(path, mine), export_load(path, theirs)
    want.recompile()
    assert got.code == want.code and mine == theirs and all(mine.values())
    assert _nodes(got) == _nodes(want)
    assert got.meta == want.meta


class _Structured(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Any:
        y = self.lin(x)
        return {"y": y, "parts": [x * 2, (y + 1, x)]}


def test_reader_rebuilds_plain_output_containers(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A model returning a dict of a list of a tuple loads by the reader alone (no
    torch.export.load) with the same structure and numbers; a named tuple as a dict."""
    torch.manual_seed(0)
    m = _Structured().eval()
    x = torch.randn(2, 4)
    opt = graphopt.optimize(m, x, target="cpu", precision="fp32", measure=False)
    got = _load_by_reader(opt.save(tmp_path / "dict.pt2"), monkeypatch)(x)
    want = m(x)
    assert isinstance(got, dict) and list(got) == ["y", "parts"]
    assert isinstance(got["parts"], list) and isinstance(got["parts"][1], tuple)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    pair = collections.namedtuple("Pair", "a b")

    class Named(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            return pair(x + 1, x * 2)

    opt = graphopt.optimize(Named().eval(), x, target="cpu", precision="fp32", measure=False)
    got = _load_by_reader(opt.save(tmp_path / "named.pt2"), monkeypatch)(x)
    assert list(got) == ["a", "b"]  # a named tuple comes back as a dict of its fields
    torch.testing.assert_close(list(got.values()), list(pair(x + 1, x * 2)))


def _bare_int8_kernel(program: dict[str, Any]) -> None:
    """graphopt's checked INT8 op renamed to the raw kernel it wraps (a crafted file)."""
    for node in program["graph_module"]["graph"]["nodes"]:
        if node["target"] == "torch.ops.graphopt.int8_weight_only_linear.default":
            node["target"] = "torch.ops.aten._weight_int8pack_mm.default"


def test_reader_refuses_a_bare_low_bit_kernel(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A file naming ``aten._weight_int8pack_mm`` itself (which segfaults on bf16 with
    K % 32 != 0, where graphopt's op falls back) is refused before anything runs."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64)).eval()
    opt = graphopt.optimize(model, torch.randn(2, 64), target="h100",
                            quantize="int8_weight_only", measure=False)
    good = opt.save(tmp_path / "good.pt2")
    assert "int8_weight_only_linear" in str(_load_by_reader(good, monkeypatch).graph_module.code)
    bad = _edited(good, tmp_path / "bare.pt2", _bare_int8_kernel)
    with pytest.raises(graphopt.GraphoptError, match="does not check its arguments"):
        _load_by_reader(bad, monkeypatch)
