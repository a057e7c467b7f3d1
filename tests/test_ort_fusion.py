"""ONNX models are grouped as ONNX Runtime fuses them (issue 12 item 3): graphopt's CPU-EP groups
are checked against the graph ORT's optimizer really writes, on this machine's CPU EP."""

from __future__ import annotations

from collections.abc import Callable

import onnx
import pytest
import torch

from graphopt.cost.ort_fusion import CPU_EP, CUDA_EP, execution_provider
from graphopt.decisions.planner import build_plan
from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.hardware.registry import get_target
from graphopt.ir.plan import Plan
from graphopt.ir.plan_sections import FusionKind
from tests import ort_fusion_models as om
from tests.zoo import RMSNormMLP, TransformerBlock

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _plan(m: onnx.ModelProto, target: str = "cpu") -> Plan:
    return build_plan(load_onnx(m), get_target(target))


def _groups(p: Plan) -> dict[frozenset[str], str]:
    """graphopt's multi-node ORT groups: node set -> the op ORT makes of them."""
    return {frozenset(g.nodes): g.fused_op for g in p.fusion.groups
            if g.kind is FusionKind.ORT}


# (model, ORT level, the ops ORT's optimized graph holds: the fusion really ran)
FIRES: dict[str, tuple[Callable[[], onnx.ModelProto], str, set[str]]] = {
    "matmul_add_relu": (om.mm_add_relu, "ORT_ENABLE_EXTENDED", {"FusedGemm"}),
    "conv_relu": (om.conv_relu, "ORT_ENABLE_EXTENDED", {"FusedConv"}),
    "conv_add_relu": (om.conv_add_relu, "ORT_ENABLE_ALL", {"FusedConv"}),
    "conv_bn_mul": (om.conv_bn_mul, "ORT_ENABLE_EXTENDED", {"Conv"}),
    "conv_add_const": (om.conv_add_const, "ORT_ENABLE_EXTENDED", {"Conv"}),
    "gelu_2d": (om.erf_gelu, "ORT_ENABLE_EXTENDED", {"Gemm", "Gelu"}),
    "gelu_3d": (lambda: om.erf_gelu((2, 4)), "ORT_ENABLE_EXTENDED", {"Gemm", "Gelu"}),
    "bias_gelu": (lambda: om.erf_gelu(("batch", 4)), "ORT_ENABLE_EXTENDED", {"BiasGelu"}),
    "skip_layer_norm": (om.layer_norm, "ORT_ENABLE_EXTENDED", {"SkipLayerNormalization"}),
    "rms_norm": (om.rms_norm, "ORT_ENABLE_EXTENDED", {"SimplifiedLayerNormalization"}),
    "silu": (om.silu, "ORT_ENABLE_EXTENDED", {"QuickGelu"}),
    "quick_gelu": (lambda: om.silu(alpha=True), "ORT_ENABLE_EXTENDED", {"QuickGelu"}),
    "scaled_scores": (om.scaled_scores, "ORT_ENABLE_EXTENDED", {"FusedMatMul"}),
    "scaled_q_and_scores": (lambda: om.scaled_scores(scaled_q=True), "ORT_ENABLE_EXTENDED",
                            {"FusedMatMul"}),
    "scaled_q_read_twice": (lambda: om.scaled_scores(scaled_q=True, q_read_twice=True),
                            "ORT_ENABLE_EXTENDED", {"FusedMatMul", "Mul"}),
    "fast_gelu_pow": (om.tanh_gelu, "ORT_ENABLE_EXTENDED", {"FastGelu"}),
    "fast_gelu_mul": (lambda: om.tanh_gelu(pow_form=False), "ORT_ENABLE_EXTENDED",
                      {"FastGelu"}),
}


@pytest.mark.parametrize("case", sorted(FIRES))
def test_cpu_groups_are_what_ort_fused(case: str) -> None:
    build, level, ops = FIRES[case]
    m = build()
    fused, ort_ops = om.ort_fused(m, level)
    assert ops <= set(ort_ops), f"ORT did not fuse {case}: {ort_ops}"
    groups = _groups(_plan(m))
    assert set(groups) == fused
    assert set(groups.values()) <= set(ort_ops) | {"Gemm"}  # an N-D Gemm sits in Reshapes


# (model, level): sub-graphs ORT leaves unfused on the CPU EP, and so must graphopt
NOT_FUSED: dict[str, tuple[Callable[[], onnx.ModelProto], str]] = {
    # ConvAddActivationFusion wants the Conv's output read by the Add alone
    "conv_output_read_twice": (lambda: om.conv_add_relu(conv_read_twice=True), "ORT_ENABLE_ALL"),
    # FastGeluFusion refuses a last Mul that is a graph output
    "fast_gelu_output": (lambda: om.tanh_gelu(last_is_output=True), "ORT_ENABLE_EXTENDED"),
    # SimplifiedLayerNormFusion does not take Sqrt -> Reciprocal
    "rms_reciprocal": (lambda: om.rms_norm(reciprocal=True), "ORT_ENABLE_EXTENDED"),
}


@pytest.mark.parametrize("case", sorted(NOT_FUSED))
def test_what_ort_leaves_is_not_grouped(case: str) -> None:
    build, level = NOT_FUSED[case]
    m = build()
    fused, _ = om.ort_fused(m, level)
    assert fused == set()
    assert _groups(_plan(m)) == {}


def test_a_skip_add_read_again_leaves_layer_norm_alone() -> None:
    m = om.layer_norm(residual_read_twice=True)
    fused, ops = om.ort_fused(m, "ORT_ENABLE_EXTENDED")
    assert "SkipLayerNormalization" not in ops
    groups = _groups(_plan(m))
    assert set(groups) == fused and set(groups.values()) == {"LayerNormalization"}


def test_fusions_follow_the_targets_execution_provider() -> None:
    """ConvActivationFusion and GemmActivationFusion do not list the CUDA EP: on an NVIDIA
    target the Relu stays its own kernel, while MatMulAddFusion (every EP) still makes a Gemm."""
    assert execution_provider(get_target("cpu")) == CPU_EP
    assert execution_provider(get_target("h100")) == CUDA_EP
    assert _groups(_plan(om.conv_relu(), "h100")) == {}
    assert _groups(_plan(om.mm_add_relu(), "h100")) == {frozenset({"mm", "add"}): "Gemm"}
    assert _groups(_plan(om.mm_add_relu(), "cpu")) == {
        frozenset({"mm", "add", "relu"}): "FusedGemm"}
    cpu = _plan(om.conv_relu()).fusion
    gpu = _plan(om.conv_relu(), "h100").fusion
    assert cpu.runtime.name == gpu.runtime.name == "onnxruntime"
    assert (cpu.runtime.execution_provider, gpu.runtime.execution_provider) == (CPU_EP, CUDA_EP)
    assert cpu.kernels_fused == 1 and gpu.kernels_fused == 2


def test_ort_groups_are_costed_as_one_kernel() -> None:
    p = _plan(om.layer_norm(), "a100")
    (g,) = p.fusion.groups
    assert g.kind is FusionKind.ORT and g.fused_op == "SkipLayerNormalization"
    assert g.rules == ("LayerNormFusion", "SkipLayerNormFusion")
    assert g.est_time_s < g.unfused_s == pytest.approx(p.est_latency_s)
    # x, r, gamma, beta and the two scalars in, y out: the nine intermediates stay inside
    assert g.external_bytes == 4 * (3 * 2 * 4 * 16 + 2 * 16 + 2)
    assert p.summary.est_latency_fused_s == pytest.approx(g.est_time_s)
    assert p.to_json() == _plan(om.layer_norm(), "a100").to_json()  # byte-deterministic


@pytest.mark.parametrize("cls,shape", [(TransformerBlock, (2, 16, 288)),
                                       (RMSNormMLP, (2, 16, 64))])
def test_torch_exported_models_group_as_ort_fuses_them(cls: type, shape: tuple[int, ...]
                                                       ) -> None:
    """A torch export: GELU, SiLU, RMSNorm, the Q/K scales and the biased linears fuse as ORT
    fuses them, and the size arithmetic ORT folds at load costs nothing."""
    from graphopt.frontends.onnx_export import export_torch

    m = export_torch(cls().eval(), (torch.randn(*shape),)).model
    fused, ops = om.ort_fused(m)
    p = _plan(m)
    groups = _groups(p)
    # GatherSliceToSplitFusion (the q, k, v Slices of one tensor into one Split) is not
    # modelled: graphopt keeps three Slice kernels there
    split = {s for s in fused if all("Slice" in n for n in s)}
    assert ("Split" in ops) == bool(split)
    assert set(groups) == fused - split
    folded = [g for g in p.fusion.groups if g.kind is FusionKind.FOLDED]
    assert all(g.est_time_s == 0 for g in folded)
    assert p.summary.est_latency_fused_s < p.est_latency_s


def test_the_onnx_artifact_reports_ort_groups_for_its_ep(tmp_path) -> None:
    """``export_onnx``'s report section carries the file's groups as ORT fuses it on the CPU EP,
    and they are what ORT fuses in the file written."""
    import graphopt

    opt = graphopt.optimize(RMSNormMLP().eval(), (torch.randn(2, 16, 64),), target="cpu",
                            measure=False)
    out = opt.export_onnx(tmp_path / "m.onnx")
    f = opt.plan.to_dict()["onnx_optimization"]["fusion"]
    assert f["runtime"] == {"name": "onnxruntime", "execution_provider": CPU_EP,
                            "rules": f"as ONNX Runtime's graph optimizer fuses for {CPU_EP} "
                                     "at ORT_ENABLE_ALL"}
    ours = {frozenset(g["nodes"]): g["fused_op"] for g in f["groups"] if g["kind"] == "ort"}
    assert set(ours.values()) == {"SimplifiedLayerNormalization", "QuickGelu"}
    fused, _ = om.ort_fused(onnx.load(str(out)))
    assert set(ours) == fused
    assert "fusion groups:** 6 kernels for 13 nodes (onnxruntime CPUExecutionProvider" in \
        opt.plan.to_markdown()
