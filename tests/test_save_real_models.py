"""Real models as their users call them, through ``Optimized.save`` and ``graphopt.load``.

1. Any output structure (a transformers ModelOutput, dicts, tuples, named tuples, nested)
   survives save and a load in a fresh process that has only torch and graphopt: there each
   container whose type is not registered comes back as a dict of the same field names, in
   order; in a process that imported the type, as itself.
2. A model library's op in the saved graph is decomposed to aten at save when its Python code
   traces; otherwise save warns with the op and its module, and load says which to import.
3. The zoo: every transformers architecture of ``arch_zoo`` saves and loads in a process that
   never imports transformers, with the optimized module's outputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import graphopt
from graphopt.errors import GraphoptError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
transformers = pytest.importorskip("transformers")

# loads each file given, calls it on its inputs, saves the outputs; prints the output types and
# whether any transformers module got imported (it must not be)
_FRESH = """
import json, sys, torch, graphopt
inputs, outs, types, errors = torch.load(sys.argv[1], weights_only=True), {}, {}, {}
for path in sys.argv[2:]:
    try:
        m = graphopt.load(path)
    except graphopt.GraphoptError as e:
        errors[path] = str(e)
        continue
    with torch.no_grad():
        out = m(*inputs[path])
    outs[path], types[path] = out, type(out).__name__
torch.save(outs, sys.argv[1] + ".out")
print(json.dumps({"types": types, "errors": errors,
                  "imported": sorted(k for k in sys.modules if k.startswith("transformers"))}))
"""


def _fresh_load(tmp_path: Path, calls: dict[str, tuple[Any, ...]]) -> tuple[dict, dict]:
    """Load and call each saved file in one process without transformers."""
    torch.save(calls, tmp_path / "inputs.pt")
    done = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path / "inputs.pt"), *calls],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["imported"] == []  # no model code there
    return torch.load(str(tmp_path / "inputs.pt") + ".out", weights_only=True), report


def _by_field(out: Any) -> Any:
    """An output as plain data: each mapping a list of (field, value), each sequence a list."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):  # a ModelOutput is an OrderedDict
        return [(k, _by_field(v)) for k, v in out.items()]
    if hasattr(out, "_fields"):
        return [(k, _by_field(getattr(out, k))) for k in out._fields]
    return [_by_field(v) for v in out]


def _same(got: Any, want: Any) -> None:
    got, want = _by_field(got), _by_field(want)
    assert str(pytree_shape(got)) == str(pytree_shape(want))
    torch.testing.assert_close(_tensors(got), _tensors(want), rtol=1e-5, atol=1e-5)


def _tensors(data: Any) -> list[torch.Tensor]:
    if isinstance(data, torch.Tensor):
        return [data]
    return [t for d in data for t in _tensors(d[1] if isinstance(d, tuple) else d)]


def pytree_shape(data: Any) -> Any:
    """The fields and nesting of :func:`_by_field` data, tensors left out."""
    if isinstance(data, torch.Tensor):
        return "T"
    return [(d[0], pytree_shape(d[1])) if isinstance(d, tuple) else pytree_shape(d)
            for d in data]


def _bert() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64)
    return transformers.BertModel(config).eval(), torch.randint(0, 128, (2, 8))


# --- case 1: output structures -------------------------------------------------------------------
Pair = namedtuple("Pair", ["low", "high"])


class Nested(nn.Module):
    """Returns a dict holding a tuple, a list and a named tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> Any:
        y = self.lin(x)
        return {"z": (y, [y.relu(), y * 2]), "a": Pair(y.sin(), y.cos()), "n": y.sum()}


@pytest.mark.slow
def test_bert_outputs_load_by_field_without_transformers(tmp_path: Path) -> None:
    """Case 1, static and dynamic: BertModel's ModelOutput comes back as a dict there."""
    model, ids = _bert()
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=32)
    static = graphopt.optimize(model, (ids,), target="cpu", measure=False)
    dynamic = graphopt.optimize(model, (ids,), target="cpu", measure=False,
                                dynamic_shapes=({0: batch, 1: seq},))
    other = torch.randint(0, 128, (3, 17))
    calls = {str(static.save(tmp_path / "static.pt2")): (ids,),
             str(dynamic.save(tmp_path / "dynamic.pt2")): (other,)}
    outs, report = _fresh_load(tmp_path, calls)
    assert report["errors"] == {}
    assert set(report["types"].values()) == {"dict"}
    with torch.no_grad():
        _same(outs[str(tmp_path / "static.pt2")], static.module(ids))
        _same(outs[str(tmp_path / "dynamic.pt2")], dynamic.module(other))
    # here the user imported transformers: the ModelOutput type itself comes back
    loaded = graphopt.load(tmp_path / "dynamic.pt2")
    with torch.no_grad():
        got = loaded(other)
        assert type(got) is type(model(other))
        _same(got, dynamic.module(other))


def test_nested_outputs_keep_their_fields_and_order(tmp_path: Path) -> None:
    """Case 1: dict -> tuple/list -> tensors, a named tuple (a dict of its fields), a scalar."""
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    opt = graphopt.optimize(Nested().eval(), (x,), target="cpu", measure=False)
    loaded = graphopt.load(opt.save(tmp_path / "nested.pt2"))
    with torch.no_grad():
        got, want = loaded(x), opt.module(x)
    assert list(got) == ["z", "a", "n"] and isinstance(got["z"], tuple)
    assert isinstance(got["z"][1], list)
    assert isinstance(got["a"], dict) and list(got["a"]) == ["low", "high"]
    _same(got, want)


def test_a_record_of_a_type_this_process_lacks_is_a_dict_and_nothing_is_imported() -> None:
    """Case 1: the record names a module; the loader never imports it."""
    from graphopt.backends.torch.saved_format import structure_spec

    record = {"type": "no_such_module_xyz.Output", "fields": ["a", "b"], "context": '["a", "b"]',
              "children": [None, None]}
    spec = structure_spec(record)
    assert spec.type is dict and spec.context == ["a", "b"]
    assert "no_such_module_xyz" not in sys.modules


# --- case 2: model-library ops -------------------------------------------------------------------
@torch.library.custom_op("savetest::scaled", mutates_args=())
def _scaled(x: torch.Tensor) -> torch.Tensor:
    """Traces: save writes its aten ops."""
    return x * 2.0 + 1.0


@_scaled.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("savetest::host", mutates_args=())
def _host(x: torch.Tensor) -> torch.Tensor:
    """Does not trace: it runs in numpy."""
    return torch.from_numpy(np.tanh(x.detach().cpu().numpy())).to(x.device)


@_host.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Library(nn.Module):
    def __init__(self, op: Any) -> None:
        super().__init__()
        self.lin, self.op = nn.Linear(8, 8), op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(self.lin(x))


def test_a_library_op_that_traces_is_saved_as_aten(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    opt = graphopt.optimize(Library(torch.ops.savetest.scaled).eval(), (x,), target="cpu",
                            measure=False)
    path = opt.save(tmp_path / "scaled.pt2")
    outs, report = _fresh_load(tmp_path, {str(path): (x,)})  # savetest:: not registered there
    assert report["errors"] == {}
    torch.testing.assert_close(outs[str(path)], opt.module(x), rtol=1e-5, atol=1e-5)


def test_a_library_op_that_does_not_trace_is_named_at_save_and_load(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    opt = graphopt.optimize(Library(torch.ops.savetest.host).eval(), (x,), target="cpu",
                            measure=False)
    with pytest.warns(UserWarning, match=r"savetest::host.*test_save_real_models"):
        path = opt.save(tmp_path / "host.pt2")
    torch.testing.assert_close(graphopt.load(path)(x), opt.module(x))  # registered here
    _, report = _fresh_load(tmp_path, {str(path): (x,)})
    error = report["errors"][str(path)]
    assert "savetest::host" in error and "test_save_real_models before graphopt.load" in error
    assert "damaged" not in error


@pytest.mark.slow
def test_transformers_moe_op_is_named_with_its_module(tmp_path: Path) -> None:
    """Case 2 on Mixtral: transformers' grouped_mm_fallback loops over a tensor's values."""
    sys.path.insert(0, str(Path(__file__).parent))
    import arch_zoo

    model, args = arch_zoo.build("mixtral")
    opt = graphopt.optimize(model, args, target="cpu", measure=False)
    with pytest.warns(UserWarning, match=r"transformers::grouped_mm_fallback.*"
                                         r"transformers\.integrations\.moe"):
        path = opt.save(tmp_path / "mixtral.pt2")
    _, report = _fresh_load(tmp_path, {str(path): args})
    error = report["errors"][str(path)]
    assert "import transformers.integrations.moe" in error and "damaged" not in error
    with torch.no_grad():
        torch.testing.assert_close(graphopt.load(path)(*args), opt.module(*args))


def test_a_record_naming_an_unregistered_op_says_what_to_import(tmp_path: Path) -> None:
    from graphopt.backends.torch.load import _registered

    assert _registered("aten::add.Tensor") and not _registered("nolib_xyz::op")
    with pytest.raises(GraphoptError, match="no saved model"):
        graphopt.load(tmp_path / "missing.pt2")


# --- case 3: the zoo -----------------------------------------------------------------------------
@pytest.mark.slow
def test_every_zoo_model_saves_and_loads_without_transformers(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import arch_zoo

    opts, calls, libs = {}, {}, {}
    for arch in arch_zoo.ARCHS:
        model, args = arch_zoo.build(arch.name)
        opts[arch.name] = opt = graphopt.optimize(model, args, target="cpu", measure=False)
        path = tmp_path / f"{arch.name}.pt2"
        with warnings.catch_warnings():  # mixtral's library op is said (case 2)
            warnings.simplefilter("ignore", UserWarning)
            opt.save(path)
        calls[str(path)] = args
        libs[str(path)] = arch.name == "mixtral"  # transformers' own MoE op (case 2)
    outs, report = _fresh_load(tmp_path, calls)
    for path, args in calls.items():
        if libs[path]:
            assert "import transformers.integrations.moe" in report["errors"][path]
            continue
        assert path not in report["errors"], report["errors"].get(path)
        with torch.no_grad():
            _same(outs[path], opts[Path(path).stem].module(*args))

