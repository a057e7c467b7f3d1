"""Dynamic ONNX export over a shape range (issue 24, item 2).

The TorchScript exporter bakes a traced size into ``nn.MultiheadAttention``'s Reshape; the check
in ONNX Runtime at the range's min and max catches it, and ``torch.onnx.export(dynamo=True)``
with the user's ``dynamic_shapes`` exports the model instead. Each export is then run in ONNX
Runtime at three shapes of the range and compared with the torch model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

import graphopt
from graphopt.errors import GraphoptError
from graphopt.frontends.onnx_export import export_torch
from graphopt.ir.shape_range import DimRange, ShapeRange

ort = pytest.importorskip("onnxruntime")

#: fp32 reorders sums at most (verify.py's fp32 budget), per output's largest magnitude
FP32_RTOL = 1e-5


def _ort_matches(path: Path, model: nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    got = sess.run(None, {k: v.numpy() for k, v in inputs.items() if k in names})[0]
    with torch.no_grad():
        want = model(*inputs.values()).numpy()
    assert got.shape == want.shape
    scale = float(np.max(np.abs(want)))
    assert float(np.max(np.abs(got - want))) <= FP32_RTOL * scale


def _symbolic(path: Path) -> list[list[str | int]]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in proto.graph.input]


@pytest.mark.slow
def test_transformer_encoder_exports_over_its_range(tmp_path: Path):
    """Failed before: the TorchScript export baked {17, 5, 72} into a Reshape and the dynamo
    fallback got an (args, kwargs) spec torch.export rejects, so export_onnx raised."""
    torch.manual_seed(0)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(72, 4, batch_first=True),
                                  2).eval()
    x = torch.randn(5, 17, 72)
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=64)
    opt = graphopt.optimize(model, x, target="cpu", measure=False, quantize="none",
                            dynamic_shapes=({0: batch, 1: seq},))
    path = opt.export_onnx(tmp_path / "enc.onnx")
    assert opt.onnx_info.exporter == "dynamo"
    assert _symbolic(path) == [["batch", "seq", 72]]
    for b, s in ((1, 2), (3, 17), (8, 64)):
        _ort_matches(path, model, {"src": torch.randn(b, s, 72)})


class _LastHidden(nn.Module):
    """A transformers encoder as serving code calls it: ids in, last_hidden_state out."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids).last_hidden_state


@pytest.mark.slow
def test_bert_exports_over_its_range(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=1000, max_position_embeddings=64))
    model = _LastHidden(bert).eval()
    ids = torch.randint(0, 1000, (2, 16))
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=64)
    opt = graphopt.optimize(model, (ids,), target="cpu", measure=False, quantize="none",
                            dynamic_shapes=({0: batch, 1: seq},))
    path = opt.export_onnx(tmp_path / "bert.onnx")
    assert _symbolic(path) == [["batch", "seq"]]
    gen = torch.Generator().manual_seed(1)
    for b, s in ((1, 2), (3, 17), (8, 64)):
        _ort_matches(path, model, {"input_ids": torch.randint(0, 1000, (b, s), generator=gen)})


class _ReadsValues(nn.Module):
    """Reads its input's values into Python: the TorchScript exporter bakes them in as a
    constant (wrong at any other shape), torch.export cannot trace it at all."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tensor(x.tolist()) * 2.0


def test_both_exporters_failing_gives_both_reasons():
    x = torch.randn(4, 8)
    rng = ShapeRange((DimRange("batch", 1, 4, 8, "dynamic_shapes"),), {"x": ("batch", 8)})
    with pytest.raises(GraphoptError) as err:
        export_torch(_ReadsValues().eval(), (x,), shape_range=rng,
                     dynamic_shapes=({0: Dim("batch", min=1, max=8)},))
    msg = str(err.value)
    assert "at input shapes" in msg  # the TorchScript export, checked at the range's points
    assert "dynamo=True" in msg  # ... and the dynamo exporter's own reason


def test_dynamo_spec_is_keyed_by_forward_parameters():
    """torch.export binds the spec to forward's signature: an (args, kwargs) pair is two
    entries where forward takes one."""
    from graphopt.frontends.onnx_export_range import _dynamic_shapes

    class Two(nn.Module):
        def forward(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            return a if mask is None else a * mask

    rng = ShapeRange((DimRange("n", 1, 4, 8),), {"a": ("n", 3), "mask": ("n", 3)})
    a = torch.ones(4, 3)
    spec = _dynamic_shapes(Two(), (a,), {"mask": a}, list(rng.inputs.values()), rng)
    assert list(spec) == ["a", "mask"]
    assert list(spec["a"]) == [0] and spec["mask"][0].__name__ == "n"
    one = _dynamic_shapes(Two(), (a,), {}, [("n", 3)], rng)
    assert list(one) == ["a"]
