"""CPU INT8 decided per node by cost, on every int8 ISA path (issue 21, item 1).

The host's ISA is pinned with ``GRAPHOPT_HOST_ISA`` (``tests.hostisa.host_isa``) to each path:
an AVX2-only host (Zen 3: VPMADDUBSW u8s8), a VNNI host (Ice Lake: VPDPBUSD) and an AMX host
(Sapphire Rapids: AMX-INT8 tiles, and native bf16, so INT8 competes with bf16 there). Only
graphopt's view of the host changes: the kernels run on this machine, so every INT8 set chosen
is run and compared with the original on the same inputs, within graphopt's int8 tolerance
(``decisions/tolerance.py``).

The host's cores, clock and bandwidth stay this machine's, so the sizes are chosen for answers
that do not depend on them: the "big" GEMMs gain 25-75% on 1-128 cores; the "tiny" ones
(8 x 64 x 64) cost less than the two extra ops the quantization adds on any of them; the
weight-bound ones (16 rows, 2048 wide) halve their weight traffic.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import onnx
import pytest
import torch

import graphopt
from graphopt.decisions.planner import build_plan
from graphopt.decisions.precision.gemm import node_precision
from graphopt.decisions.quantization.cpu_int8 import (
    CONV_INT8_MEASURED,
    GROUPED_CONV_INT8_MEASURED,
    MIN_GAIN,
)
from graphopt.decisions.tolerance import tolerance_for
from graphopt.frontends.onnx_export import export_torch
from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.hardware import get_target
from graphopt.ir.plan import NodePlan
from tests.hostisa import host_isa, real_host_flags
from tests.onnx_rewrite_models import init, model

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning",
                                        "ignore::DeprecationWarning")

#: stand-in ISA -> (its int8 path, the carrier a model runs at under precision="auto")
ISAS = {"epyc-7763": ("avx2_u8s8", "fp32"), "xeon-8380": ("avx512_vnni", "fp32"),
        "xeon-8480": ("amx_int8", "bf16")}
INT8 = tolerance_for("int8")


def mlp(widths: tuple[int, ...], rows: tuple[int, ...], seed: int = 0
        ) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """Linear + GELU layers through ``widths``, on an input of shape ``rows + (widths[0],)``."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
        layers += [torch.nn.Linear(a, b)] + ([torch.nn.GELU()] if i < len(widths) - 2 else [])
    return torch.nn.Sequential(*layers).eval(), (torch.randn(*rows, widths[0]),)


#: distinct weight shapes, so a torch Linear pairs with its ONNX node by shape alone
BIG = (256, 768, 2048, 1024, 128), (512,)
TINY = (64, 64, 64, 64, 64), (8,)
WEIGHT_BOUND = (2048, 2048, 2048, 2048), (16,)


def precisions(plan: Any) -> dict[str, Any]:
    return {n.name: n.decisions["precision"] for n in plan.nodes
            if n.op_type in ("Linear", "MatMul", "Gemm") and "precision" in n.decisions}


def int8_nodes(plan: Any) -> list[str]:
    return [n for n, d in precisions(plan).items() if d.detail.format == "int8"]


#: ORT runs a VNNI stand-in's plan (u8s8, no reduced range) on this host's own kernels: on a
#: CPU without VNNI those sums saturate (AVX2's VPMADDUBSW), and the guard, which measures
#: here, keeps nodes in float that the stand-in would quantize (seen on an AVX2-only EPYC)
NEEDS_VNNI = pytest.mark.skipif(
    not {"avx512_vnni", "avx_vnni", "amx_int8"} & real_host_flags(),
    reason="the stand-in's INT8 kernels need VNNI on the real host to be within budget")


def quantized(opt: Any) -> list[str]:
    return [n.name for n in opt.plan.nodes
            if "quantize" in n.decisions and n.decisions["quantize"].applied]


def within_int8(ref: np.ndarray, out: np.ndarray) -> None:
    """Max error within the int8 budget of the output's scale, and the cosine floor."""
    ref, out = np.asarray(ref, np.float64).ravel(), np.asarray(out, np.float64).ravel()
    err = float(np.abs(ref - out).max() / np.abs(ref).max())
    cos = float(ref @ out / (np.linalg.norm(ref) * np.linalg.norm(out)))
    assert 0 < err <= INT8.rel_to_scale and cos >= INT8.min_cosine, (err, cos)


# --- the decision and its reason, per ISA path ---------------------------------------------

@pytest.mark.parametrize("isa", ISAS)
def test_big_gemms_are_int8_on_every_path_where_the_cost_says_so(isa: str) -> None:
    """AVX2 and VNNI against fp32: the middle GEMMs of the big MLP pay. AMX against its native
    bf16 (AMX bf16 tiles, half AMX-INT8's rate): the compute-bound ones do not (quantizing and
    casting the activations cost more than the int8 tiles save), the weight-bound ones do
    (int8 halves the weight traffic). The first and last weight GEMMs follow the cost too,
    marked ``edge`` for the accuracy checks that measure them (rule 6 on CPUs)."""
    path, carrier = ISAS[isa]
    with host_isa(isa):
        big = precisions(graphopt.plan(*mlp(*BIG), target="cpu"))
        bound = precisions(graphopt.plan(*mlp(*WEIGHT_BOUND), target="cpu"))
    first, last = "linear", f"linear_{len(big) - 1}"
    for name, edge in ((first, "first"), (last, "last")):
        d = big[name]
        assert d.detail.format == ("int8" if carrier == "fp32" else carrier)
        if d.detail.format == "int8":
            assert d.detail.edge == edge and f"the {edge} weight GEMM" in d.reason
    middle = {n: d for n, d in big.items() if n not in (first, last)}
    for d in [*middle.values(), bound["linear_1"]]:
        assert f"INT8 ({path}) " in d.reason and f" vs {carrier} " in d.reason
        assert "quantizing activations" in d.reason and "(dynamic)" in d.reason
        assert (" + casts " in d.reason) == (carrier == "bf16")
    want = "bf16" if carrier == "bf16" else "int8"
    assert {d.detail.format for d in middle.values()} == {want}
    if want == "int8":
        assert all("% faster; applied by" in d.reason for d in middle.values())
    else:
        assert all("eat what the int8 GEMM saves" in d.reason for d in middle.values())
    d = bound["linear_1"]
    assert d.detail.format == "int8" and d.detail.baseline == carrier
    assert d.detail.runs_on == "torch" and d.detail.speedup >= 1 / (1 - MIN_GAIN)
    assert "applied by torch's dynamic INT8 pass" in d.reason


@pytest.mark.parametrize("isa", ISAS)
def test_tiny_gemms_stay_because_quantizing_eats_the_gain(isa: str) -> None:
    _, carrier = ISAS[isa]
    with host_isa(isa):
        tiny = precisions(graphopt.plan(*mlp(*TINY), target="cpu"))
    for name in ("linear_1", "linear_2"):
        d = tiny[name]
        assert d.detail.format == carrier and not d.detail.baseline
        assert "quantizing the activations and its extra ops" in d.reason
        assert "eat what the int8 GEMM saves" in d.reason


def test_a_measured_int8_rate_replaces_the_table() -> None:
    """A calibrated profile's ``matrix:int8`` is the GEMM's rate; measured no faster than fp32
    (an int8 kernel without a fast path), the big GEMM stays fp32."""
    icelake = get_target("xeon-8380")
    node = build_plan(load_onnx(_onnx_mlp(1024, 2048)), icelake).node("mm1")
    table = node_precision(node, icelake)
    assert table.detail.format == "int8" and "AVX512-VNNI VPDPBUSD: peak" in table.reason
    fast = dataclasses.replace(icelake, measured_rates={"matrix:int8": 8e12,
                                                        "matrix:fp32": 2e12})
    d = node_precision(node, fast)
    assert d.detail.format == "int8" and "(at 8000 GOP/s, measured by graphopt calibrate)" \
        in d.reason
    slow = dataclasses.replace(icelake, measured_rates={"matrix:int8": 2e12,
                                                        "matrix:fp32": 2e12})
    d = node_precision(node, slow)
    assert d.detail.format == "fp32" and "measured by graphopt calibrate" in d.reason


# --- the numbers of every INT8 set chosen, both backends, the same nodes --------------------

def _shape_key(n: NodePlan) -> tuple[int, ...]:
    w = n.inputs[1]
    assert w is not None and w.shape is not None
    return tuple(sorted(w.shape))


def _by_weight(plan: Any, names: list[str]) -> set[tuple[int, ...]]:
    nodes = {n.name: n for n in plan.nodes}
    return {_shape_key(nodes[n]) for n in names}


def _torch_and_onnx(isa: str, case: tuple[tuple[int, ...], tuple[int, ...]], **onnx_kw: Any
                    ) -> tuple[Any, Any, Any, tuple[torch.Tensor]]:
    m, x = mlp(*case)
    with host_isa(isa):
        plan = graphopt.plan(m, x, target="cpu")
        t_opt = graphopt.optimize(m, x, target="cpu", measure=False)
        proto = export_torch(m, x).model
        o_opt = graphopt.optimize(proto, target="cpu", measure=False, **onnx_kw)
    return plan, t_opt, o_opt, x


def _run_onnx(proto: onnx.ModelProto, x: torch.Tensor) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]


@pytest.mark.parametrize(("isa", "case"), [
    ("epyc-7763", BIG), pytest.param("xeon-8380", BIG, marks=NEEDS_VNNI),
    ("xeon-8480", WEIGHT_BOUND),
    pytest.param("xeon-8380", ((256, 768, 2048, 1024, 128), (4, 128)),  # 3-D: MatMul + Add
                 marks=NEEDS_VNNI),
], ids=["avx2-gemm", "vnni-gemm", "amx-weight-bound", "vnni-3d-matmul"])
def test_both_backends_apply_the_plans_int8_set_within_tolerance(isa: str, case) -> None:
    """The plan's INT8 nodes are exactly what torch (quantized::linear_dynamic) and ONNX
    (dynamic INT8: a 2-D Linear exports as Gemm, written as MatMul + Add for ORT; a 3-D one
    as MatMul) quantize, paired by weight; both outputs within the int8 tolerance."""
    plan, t_opt, o_opt, x = _torch_and_onnx(isa, case)
    chosen = int8_nodes(plan)
    assert chosen, "the case must choose an INT8 set"
    assert quantized(t_opt) == chosen
    assert _by_weight(o_opt.plan, quantized(o_opt)) == _by_weight(plan, chosen)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in
                                                          o_opt.onnx_model.graph.node}
    m = mlp(*case)[0]
    with torch.no_grad():
        ref = m(*x).numpy()
        within_int8(ref, t_opt.module(*x).numpy())
    within_int8(ref, _run_onnx(o_opt.onnx_model, x[0]))


def test_a_bf16_host_casts_around_the_int8_kernel() -> None:
    """On the AMX stand-in the model runs in bf16 and INT8 beats bf16 on the weight-bound
    GEMMs: torch widens the input and narrows the output around linear_dynamic (the plan's
    cost charged those casts), and the reason says so."""
    m, x = mlp(*WEIGHT_BOUND)
    with host_isa("xeon-8480"):
        opt = graphopt.optimize(m, x, target="cpu", measure=False)
    assert opt.info.compute_dtype == "bf16"
    assert quantized(opt) == ["linear", "linear_1", "linear_2"]  # the ends too (rule 6)
    for name in quantized(opt):
        reason = next(n for n in opt.plan.nodes if n.name == name).decisions["quantize"].reason
        assert "fp32 kernel in a bf16 model: cast around it" in reason and " vs bf16 " in reason
    code = opt.module.graph_module.code
    assert code.count("quantized.linear_dynamic") == 3 and "dtype = torch.float32" in code
    with torch.no_grad():
        within_int8(m(*x).numpy(), opt.module(*x).float().numpy())


@NEEDS_VNNI
def test_static_int8_with_calibration_applies_the_same_set() -> None:
    """With calibration data ONNX runs the plan's INT8 nodes as static QDQ: the same nodes."""
    m, x = mlp(*BIG)
    calibration = [{"input": torch.randn(*x[0].shape, generator=torch.Generator().manual_seed(s)
                                         ).numpy()} for s in range(4)]
    with host_isa("xeon-8380"):
        plan = graphopt.plan(m, x, target="cpu")
        proto = export_torch(m, x).model
        name = proto.graph.input[0].name
        calibration = [{name: c["input"]} for c in calibration]
        o_opt = graphopt.optimize(proto, target="cpu", measure=False, calibration=calibration)
    assert _by_weight(o_opt.plan, quantized(o_opt)) == _by_weight(plan, int8_nodes(plan))
    assert all("static QDQ U8S8" in n.decisions["quantize"].reason for n in o_opt.plan.nodes
               if n.name in quantized(o_opt))
    with torch.no_grad():
        within_int8(m(*x).numpy(), _run_onnx(o_opt.onnx_model, x[0]))


# --- convolutions: the same rule, costed as static QDQ -------------------------------------

def _onnx_mlp(rows: int, d: int) -> onnx.ModelProto:
    from onnx import helper

    nodes, cur = [], "x"
    for i in range(3):
        nodes += [helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        cur = f"r{i}"
    return model(nodes, {"x": [rows, d]}, {cur: [rows, d]},
                 [init(f"w{i}", d, d, scale=1 / np.sqrt(d)) for i in range(3)])


def _resnet_stage(c: int = 64, hw: int = 56, batch: int = 4, groups: int = 1
                  ) -> onnx.ModelProto:
    """Four 3x3 C -> C convs with ReLUs (a ResNet stage's shape; depthwise if groups = C)."""
    from onnx import helper

    nodes, cur = [], "x"
    for i in range(4):
        nodes += [helper.make_node("Conv", [cur, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}",
                                   pads=[1, 1, 1, 1], kernel_shape=[3, 3], group=groups),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        cur = f"r{i}"
    inits = [t for i in range(4) for t in (init(f"w{i}", c, c // groups, 3, 3),
                                           init(f"b{i}", c))]
    return model(nodes, {"x": [batch, c, hw, hw]}, {cur: [batch, c, hw, hw]}, inits)


@pytest.mark.parametrize("target", ["epyc-7763", "xeon-8380"])
def test_convs_are_int8_by_the_static_cost_and_only_with_calibration(target: str,
                                                                      caplog) -> None:
    """A ResNet stage on fixed targets: every conv pays as static QDQ (QLinearConv).
    Without calibration data nothing runs them (never dynamic: ConvInteger measured slower),
    and the reason says so; with it they become QLinearConv, within the int8 tolerance."""
    caplog.set_level(logging.ERROR)
    m = _resnet_stage()
    plan = build_plan(load_onnx(m), get_target(target))
    convs = {n.name: n.decisions["precision"] for n in plan.nodes if n.op_type == "Conv"}
    every = ["conv0", "conv1", "conv2", "conv3"]  # the ends too, marked (rule 6 on CPUs)
    assert [n for n, d in convs.items() if d.detail.format == "int8"] == every
    assert all("(static)" in convs[n].reason and "QLinearConv" in convs[n].reason
               for n in every)
    assert convs["conv0"].detail.edge == "first" and convs["conv3"].detail.edge == "last"
    plain = graphopt.optimize(m, target=target, measure=False)
    assert quantized(plain) == []
    reason = next(n for n in plain.plan.nodes if n.name == "conv1").decisions["quantize"].reason
    assert "pass calibration data" in reason and CONV_INT8_MEASURED in reason
    rng = np.random.default_rng(0)
    shape = (4, 64, 56, 56)
    cal = [{"x": np.maximum(rng.standard_normal(shape), 0).astype(np.float32)}
           for _ in range(3)]
    opt = graphopt.optimize(m, target=target, measure=False, calibration=cal)
    assert quantized(opt) == every
    import onnxruntime as ort

    feed = {"x": np.maximum(rng.standard_normal(shape), 0).astype(np.float32)}
    ref = ort.InferenceSession(m.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feed)[0]
    out = ort.InferenceSession(opt.onnx_model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feed)[0]
    within_int8(ref, out)


@pytest.mark.parametrize("target", ["epyc-7763", "xeon-8380", "xeon-8480"])
def test_depthwise_convs_stay_float(target: str) -> None:
    """Measured: no int8 depthwise conv beats fp32 (the dot products sum over input channels,
    which a depthwise conv does not have), so the cost model is not asked."""
    plan = build_plan(load_onnx(_resnet_stage(c=256, groups=256, batch=8)), get_target(target))
    for n in plan.nodes:
        if n.op_type == "Conv" and n.name not in ("conv0", "conv3"):
            d = n.decisions["precision"]
            assert d.detail.format != "int8" and GROUPED_CONV_INT8_MEASURED in d.reason


class _WithDeadHead(torch.nn.Module):
    """An MLP whose forward also runs a head it does not return (BERT's pooler under
    ``last_hidden_state``): the trace keeps the dead Linear, the ONNX export drops it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp(*BIG)[0]
        self.head = torch.nn.Linear(128, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        self.head(y)  # noqa: B018 - dead on purpose
        return y


@NEEDS_VNNI
def test_a_dead_gemm_is_not_the_last_and_stays() -> None:
    """First and last weight GEMMs are counted among those an output depends on, so the torch
    plan (which keeps the dead head) and the ONNX export (which drops it) mark the same edges
    and quantize the same."""
    torch.manual_seed(0)
    m, x = _WithDeadHead().eval(), mlp(*BIG)[1]
    with host_isa("xeon-8380"):
        plan = graphopt.plan(m, x, target="cpu")
        t_opt = graphopt.optimize(m, x, target="cpu", measure=False)
        o_opt = graphopt.optimize(export_torch(m, x).model, target="cpu", measure=False)
    prec = precisions(plan)
    dead = [n for n, d in prec.items() if "no graph output depends on it" in d.reason]
    assert len(dead) == 1 and prec[dead[0]].detail.format == "fp32"
    assert prec["linear_3"].detail.edge == "last"  # the body's last, not the head
    assert quantized(t_opt) == int8_nodes(plan) == ["linear", "linear_1", "linear_2",
                                                    "linear_3"]
    assert _by_weight(o_opt.plan, quantized(o_opt)) == _by_weight(plan, int8_nodes(plan))
