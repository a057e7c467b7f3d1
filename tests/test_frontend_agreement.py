"""Both frontends give the same kernel classes and dims for GEMMs, convs and attention."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from graphopt.analysis import KernelClass, annotate
from graphopt.frontends import load_graph
from tests.zoo import Attention, ConvNet, ManualAttention

_COMPARED = (KernelClass.GEMM, KernelClass.GEMV, KernelClass.CONV)


def _signature(graph):
    an = annotate(graph)
    mm = Counter((a.kernel_class.value, tuple(sorted(a.dims.items())))
                 for a in an.values() if a.kernel_class in _COMPARED)
    att = {tuple(sorted(a.dims.items())) for a in an.values()
           if a.kernel_class is KernelClass.ATTENTION}
    return mm, att


@pytest.mark.parametrize("make", [ConvNet, Attention, ManualAttention])
def test_torch_and_onnx_agree(tmp_path, make):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(2, 3, 16, 16) if make is ConvNet else torch.randn(2, 10, 288)
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    t_mm, t_att = _signature(load_graph(model, (x,)))
    o_mm, o_att = _signature(load_graph(str(path)))
    assert t_mm == o_mm
    assert t_att == o_att
    if make is ConvNet:
        convs = [d for (kc, d), _ in t_mm.items() if kc == "conv"]
        assert len(convs) == 3
    else:
        assert t_att == {tuple(sorted({"batch": 2, "heads": 4, "seq_q": 10, "seq_kv": 10,
                                       "head_dim": 72}.items()))}
