"""Issue 31, item 1: an ONNX file exported with ``dynamic_axes`` is planned at the sizes the user
gives, not at 1.

Transformers exported with dynamic axes compute their reshape targets at run time
(``Shape -> Gather -> Concat -> Reshape``), which ONNX's shape inference turns into fresh
unknown symbols. The plan of such a file at its opt point must equal the plan of its static
twin (the same model exported at the opt sizes): the same GEMM dims, the estimate within 5%.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import graphopt
from graphopt.analysis.kernel_class import GEMM_LIKE

transformers = pytest.importorskip("transformers")

BATCH, SEQ = 8, 128


class _Bert(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        config = transformers.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=128,
                                         max_position_embeddings=512)
        self.bert = transformers.BertModel(config).eval()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.bert(input_ids=ids, attention_mask=mask)
        return out.last_hidden_state, out.pooler_output


class _Vit(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=128)
        self.vit = transformers.ViTModel(config).eval()

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.vit(pixel_values=pixels).last_hidden_state


def _export(model: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path,
            names: list[str], axes: dict[str, dict[int, str]] | None) -> Path:
    torch.onnx.export(model, args, path, dynamo=False, input_names=names, opset_version=17,
                      dynamic_axes=axes)
    return path


@pytest.fixture(scope="module")
def bert_files(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("bert")
    model = _Bert().eval()
    small = (torch.randint(0, 256, (2, 16)), torch.ones(2, 16, dtype=torch.long))
    opt = (torch.randint(0, 256, (BATCH, SEQ)), torch.ones(BATCH, SEQ, dtype=torch.long))
    axes = {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}
    return (_export(model, small, folder / "dyn.onnx", ["ids", "mask"], axes),
            _export(model, opt, folder / "static.onnx", ["ids", "mask"], None))


def _gemms(plan: graphopt.Plan) -> dict[str, tuple[str, dict[str, int]]]:
    return {n.name: (n.analysis.kernel_class.value, dict(n.analysis.dims)) for n in plan.nodes
            if n.analysis.kernel_class in GEMM_LIKE}


def _same_plan(dynamic: graphopt.Plan, static: graphopt.Plan) -> None:
    gemms, twin = _gemms(dynamic), _gemms(static)
    assert gemms and gemms == {k: v for k, v in twin.items() if k in gemms}, \
        [(k, v, twin.get(k)) for k, v in gemms.items() if twin.get(k) != v][:5]
    assert dynamic.est_latency_s == pytest.approx(static.est_latency_s, rel=0.05)


def test_a_dynamic_axes_bert_plans_as_its_static_twin(bert_files) -> None:
    dyn, static = bert_files
    plan = graphopt.plan(dyn, target="h100",
                         dynamic_shapes={"batch": (1, BATCH, 64), "seq": (16, SEQ, 512)})
    _same_plan(plan, graphopt.plan(static, target="h100"))
    q = next(n for n in plan.nodes if n.name.endswith("self/query/MatMul"))
    assert q.analysis.kernel_class.value == "gemm" and q.analysis.dims["M"] == BATCH * SEQ
    assert not any("planned as 1" in w for w in plan.warnings), plan.warnings


def test_the_range_ends_scale_with_the_inputs(bert_files) -> None:
    dyn, _ = bert_files
    plan = graphopt.plan(dyn, target="h100",
                         dynamic_shapes={"batch": (1, BATCH, 64), "seq": (16, SEQ, 512)})
    ends = plan.shape_range.est_latency_s
    assert ends.opt == pytest.approx(plan.est_latency_s)
    assert ends.min < ends.opt < ends.max


def test_a_dynamic_batch_vit_plans_as_its_static_twin(tmp_path: Path) -> None:
    model = _Vit().eval()
    dyn = _export(model, (torch.randn(1, 3, 32, 32),), tmp_path / "dyn.onnx", ["pixels"],
                  {"pixels": {0: "batch"}})
    static = _export(model, (torch.randn(BATCH, 3, 32, 32),), tmp_path / "static.onnx",
                     ["pixels"], None)
    plan = graphopt.plan(dyn, target="a100", dynamic_shapes={"batch": (1, BATCH, 32)})
    _same_plan(plan, graphopt.plan(static, target="a100"))


def test_a_dim_no_input_decides_is_named_per_node(tmp_path: Path) -> None:
    """NonZero's output length depends on the data: no size gives it, and the plan says where."""
    from onnx import TensorProto, helper, save

    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"]),
             helper.make_node("GatherND", ["x", "idx"], ["y"])]
    graph = helper.make_graph(
        nodes, "nz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
         tmp_path / "nz.onnx")
    plan = graphopt.plan(tmp_path / "nz.onnx", target="cpu", dynamic_shapes={"n": 4})
    text = " ".join(plan.warnings)
    assert "planned as 1" in text and "GatherND" in text, plan.warnings


def test_shape_inference_writes_nothing_in_the_current_folder(tmp_path: Path, monkeypatch
                                                               ) -> None:
    """ORT's symbolic inference saves ``sym_shape_infer_temp.onnx`` into the current folder
    when a tensor stays unknown (here: a custom op's output); graphopt keeps what it inferred
    and writes nothing."""
    from onnx import TensorProto, helper, save

    nodes = [helper.make_node("Mystery", ["x"], ["m"], domain="acme"),
             helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(
        nodes, "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("acme", 1)])
    save(model, tmp_path / "custom.onnx")
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    plan = graphopt.plan(tmp_path / "custom.onnx", target="cpu", dynamic_shapes={"n": 4})
    assert plan.nodes and list(work.iterdir()) == []
