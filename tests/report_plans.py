"""Hand-built plan reports for the report tests (test_report_render*.py, test_report_partition.py,
test_report_data.py, test_report_browser.py): no model, no browser.

The reports hold hostile names on purpose: a node named ``<script>alert(1)</script>`` and a tensor
named ``</script><b>x``; every renderer must keep them inert.
"""

from __future__ import annotations

import json
from typing import Any

from graphopt.hardware import get_target
from graphopt.ir.plan import Plan, PlanSet
from graphopt.report._html_data import decode

EVIL_NODE = "<script>alert(1)</script>"
EVIL_TENSOR = "</script><b>x"
DATA_OPEN = '<script type="application/json" id="graphopt-data">'

TARGETS: dict[str, dict[str, Any]] = {
    "h100-sxm": {"name": "h100-sxm", "display_name": "NVIDIA H100 SXM", "kind": "gpu",
                 "generation": "hopper", "compute_capability": "9.0",
                 "peak_flops": {"fp64": 67e12, "fp32": 67e12, "tf32": 494.7e12,
                                "bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12},
                 "bandwidth_bytes_per_s": 3.35e12, "memory_bytes": 80 * 2**30},
    "a100-sxm": {"name": "a100-sxm", "display_name": "NVIDIA A100 SXM", "kind": "gpu",
                 "generation": "ampere", "compute_capability": "8.0",
                 "peak_flops": {"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12,
                                "bf16": 312e12, "fp16": 312e12},
                 "bandwidth_bytes_per_s": 2.039e12, "memory_bytes": 80 * 2**30},
}
TARGETS = {name: {**get_target(name).to_dict(), **hand} for name, hand in TARGETS.items()}
LAUNCH_S = 2e-6


def _t(name: str, shape: list[Any] | None, dtype: str = "bf16") -> dict[str, Any]:
    return {"name": name, "shape": shape, "dtype": dtype}


def _node(name: str, op: str, kc: str, flops: int, nbytes: int, target: dict[str, Any],
          **extra: Any) -> dict[str, Any]:
    """One node costed like graphopt's roofline: max(compute, memory) plus a launch."""
    peak = target["peak_flops"]["bf16"]
    ct, mt = flops / peak, nbytes / target["bandwidth_bytes_per_s"]
    bottleneck = "latency" if max(ct, mt) < LAUNCH_S else ("compute" if ct >= mt else "memory")
    node = {"name": name, "op": op, "op_type": op, "kernel_class": kc,
            "dims": {"numel": nbytes // 4}, "dtype": "bf16", "flops": flops, "bytes": nbytes,
            "bytes_read": nbytes * 2 // 3, "bytes_written": nbytes - nbytes * 2 // 3,
            "arithmetic_intensity": round(flops / nbytes, 6) if nbytes else 0.0, "params": 0,
            "bottleneck": bottleneck, "est_time_s": max(ct, mt) + LAUNCH_S,
            "compute_time_s": ct, "memory_time_s": mt, "peak_flops_used": peak,
            "cost": {"unit": "tensor_core", "precision": "bf16", "alignment_efficiency": 1.0,
                     "utilization": 0.8, "note": "", "overhead_s": LAUNCH_S,
                     "bandwidth_used": target["bandwidth_bytes_per_s"]},
            "pattern": None, "flags": [], "inputs": [_t(f"{name}.in", [4, 128])],
            "outputs": [_t(f"{name}.out", [4, 128])], "decisions": {}}
    node.update(extra)
    return node


def make_plan(target: str = "h100-sxm", extra_nodes: int = 0) -> dict[str, Any]:
    """A small transformer-ish plan with one hostile node; ``extra_nodes`` pads it out."""
    tgt = TARGETS[target]
    prec = {"precision": {"format": "bf16", "applied": True, "runs_on": "torch",
                          "reason": "tensor cores run bf16 at 15x fp32 <fast>"},
            "exec_path": {"path": "tma_wgmma", "applied": True, "tma": True,
                          "reason": "TMA loads + wgmma <tile 64x128x64>",
                          "instruction": "wgmma.mma_async.m64n128k16.f32.bf16.bf16",
                          "tile": {"m": 64, "n": 128, "k": 64, "stages": 4, "swap_ab": False,
                                   "efficiency": 0.9, "instruction": "wgmma.mma_async."
                                   "m64n128k16.f32.bf16.bf16"},
                          "launch": {"grid": [132, 1, 1], "block": [256, 1, 1],
                                     "smem_bytes": 131072, "vector_width": 8}}}
    nodes = [
        _node("layers.0.attn.q_proj", "linear", "gemm", 2 * 512 * 4096 * 4096,
              2 * (512 * 4096 * 2 + 4096 * 4096), tgt,
              dims={"M": 512, "N": 4096, "K": 4096, "batch": 1}, params=4096 * 4096,
              decisions={**prec, "padding": {"applied": False,
                                             "reason": "dims already multiples of 64"}}),
        _node("layers.0.attn.sdpa", "scaled_dot_product_attention", "attention",
              4 * 32 * 512 * 512 * 128, 4 * 32 * 512 * 128 * 2, tgt, pattern="attention:0"),
        _node(EVIL_NODE, "mul", "elementwise", 512 * 4096, 3 * 512 * 4096 * 2, tgt,
              inputs=[_t(EVIL_TENSOR, [512, "seq"]), _t("ok", None, "fp32")],
              flags=["dynamic_shape"],
              decisions={"layout": {"format": "channels_last", "region": 0,
                                    "predicted_gain_s": 1e-6, "applied": True,
                                    "reason": "</script><script>alert(2)</script> reason"}}),
        _node("layers.0.norm", "rms_norm", "rmsnorm", 5 * 512 * 4096, 2 * 512 * 4096 * 2, tgt,
              pattern="rmsnorm:0"),
        _node("layers.0.view", "view", "view", 0, 0, tgt, bottleneck="latency",
              est_time_s=0.0, compute_time_s=0.0, memory_time_s=0.0),
        _node("layers.0.softmax", "softmax", "softmax", 5 * 32 * 512 * 512,
              2 * 32 * 512 * 512 * 2, tgt),
        _node("weird", "WeirdOp", "other", 1000, 8000, tgt, flags=["unsupported_op"]),
        _node("lm_head", "linear", "gemm", 2 * 512 * 4096 * 32000,
              2 * (512 * 4096 + 4096 * 32000 + 512 * 32000), tgt,
              dims={"M": 512, "N": 32000, "K": 4096}, decisions=prec),
    ]
    nodes += [_node(f"pad.{i}", "add", "elementwise", 4096 * (i + 1), 3 * 4096 * (i + 1) * 2, tgt)
              for i in range(extra_nodes)]
    return {"schema_version": 2, "graphopt_version": "0.1.0",
            "model": {"name": "tiny-llama <test>", "source": "torch", "num_nodes": len(nodes),
                      "param_count": 4096 * 4096 + 4096 * 32000,
                      "param_bytes": 2 * (4096 * 4096 + 4096 * 32000),
                      "inputs": [_t("input_ids", [1, 512], "int64")],
                      "outputs": [_t("logits", [1, 512, 32000])]},
            "target": tgt, "summary": summarize(nodes),
            "warnings": ["1 nodes have dynamic dimensions <i>x</i> & co",
                         "ops graphopt does not know are kept: WeirdOp x1"],
            "nodes": nodes, **deployment(tgt["display_name"])}


def deployment(name: str) -> dict[str, Any]:
    """memory / quantization / runtime_settings shaped like graphopt's (from a real report)."""
    parts = [("parameters", 1478840, 0.0), ("activations (peak)", 135040, 0.0),
             ("workspace", 33554432, 0.04), ("reserve", 6871947673, 8.0),
             ("free", 78992229935, 91.96)]
    alt = [("fp32", 32.0, True, True, True, "FP32 runs on every target"),
           ("fp8_e4m3", 8.0, True, True, True, f"{name} has fp8"),
           ("nvfp4", 4.5, True, False, False, f"NVFP4 needs one of [fp4], which {name} lacks")]
    rule1 = {"value": True, "reason": "rule 1: TF32 <ok> & precision 'bf16' tolerates it"}
    return {
        "memory": {"total_bytes": 85899345920, "usable_bytes": 79027398247, "fits": True,
                   "required_bytes": 35168312, "param_bytes": 1478840, "param_format": "per-node",
                   "param_count": 369710, "constant_bytes": 0, "saved_bytes": 1474232,
                   "activation_total_bytes": 270080, "free_bytes": 78992229935,
                   "fp32_param_bytes": 2953072, "compression_ratio": 1.9969, "traced_batch": 2,
                   "activation_peak_bytes": 135040, "activation_peak_per_sample_bytes": 67520.0,
                   "peak_node": "gelu", "workspace_bytes": 33554432, "max_batch_size": 1169904,
                   "workspace_reason": "cuBLAS workspace: 32 MiB", "reserve_bytes": 6871947673,
                   "reserve_policy": "max(1 GiB, 8% of total)", "target": "h100-sxm",
                   "batch_note": "1169910 samples fit; rounded down to a multiple of 8",
                   "breakdown": [{"component": c, "bytes": b, "percent": p} for c, b, p in parts],
                   "notes": ["activations <assumed> linear in the batch"]},
        "quantization": {"format": "fp8_e4m3", "display": "FP8 (E4M3)", "bits_per_weight": 8.0,
                         "weight_bytes": 738268, "est_memory_bytes": 34427740, "fits": True,
                         "usable_bytes": 79027398247, "missing_bytes": 0,
                         "preference": "balanced", "original_format": "fp32",
                         "reason": f"balanced: the best format <= 8.5 bpw that fits on {name}",
                         "alternatives": [{"format": f, "bits_per_weight": b, "fits": ok,
                                           "native": nat, "eligible": el, "note": note,
                                           "est_memory_bytes": 34427740,
                                           "weight_bytes": int(369710 * b / 8)}
                                          for f, b, ok, nat, el, note in alt]},
        "runtime_settings": {"target": "h100-sxm", "device": "cuda", "matmul_allow_tf32": rule1,
                             "cudnn_allow_tf32": rule1, "num_threads": {"value": None,
                                                                        "reason": "rule 6"},
                             "sdpa_backends": {"value": ["flash", "efficient", "math"],
                                               "reason": "rule 4: head_dim 72 fits flash"},
                             "batch_size": {"value": 1169904, "reason": "rule 5"},
                             "float32_matmul_precision": {"value": "high", "reason": "rule 1"},
                             "cudnn_benchmark": {"value": True, "reason": "rule 2: static shapes"},
                             "cuda_alloc_conf": {"value": None, "reason": "rule 3"},
                             "mkldnn_enabled": {"value": None, "reason": "rule 7: a GPU"}},
    }


def make_optimized() -> dict[str, Any]:
    """A plan after graphopt.optimize: the optimization section from a real run, plus notes."""
    plan = make_plan()
    plan["optimization"] = {
        "passes_applied": ["precision", "padding"], "compute_dtype": "bf16",
        "passes_reverted": [{"pass": "layout", "reason": "reverted: output <0> cosine 0.98"}],
        "tolerance": {"rel_to_scale": 0.04, "min_cosine": 0.999},
        "calibration_batches": 0, "held_out_batches": 0,
        "calibration_use": "no calibration batches: checked on the example inputs",
        "numerics": [{"output": 0, "max_abs": 0.003986328840255737, "within": True,
                      "max_rel": 0.42490918188764704, "cosine": 0.999999512698278,
                      "scale": 4.066221237182617,
                      "tolerance": {"rel_to_scale": 0.04, "min_cosine": 0.999}}],
        "notes": {"precision": {"casts_inserted": 4, "fp32_islands": 2, "requested": "bf16",
                                "runtime": {"allow_tf32": False}},
                  "padding": {"padded_nodes": ["linear", "linear_2", "sdpa"], "carried": 1,
                              "slices": ["slice_out"], "mode": "auto"},
                  "layout": {"conversions": 2, "inserted": 2, "regions": [{"id": 0}]}}}
    return plan


def summarize(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    total = sum(n["est_time_s"] for n in nodes)
    kernels = [n for n in nodes if n["kernel_class"] != "view"]
    mix = {b: sum(n["bottleneck"] == b for n in kernels) for b in ("compute", "memory", "latency")}
    tb = {b: sum(n["est_time_s"] for n in nodes if n["bottleneck"] == b) for b in mix}
    classes = sorted({n["kernel_class"] for n in nodes})
    costly = sorted(kernels, key=lambda n: (-n["est_time_s"], n["name"]))[:5]
    return {"est_latency_s": total, "node_count": len(nodes), "kernel_count": len(kernels),
            "total_flops": sum(n["flops"] for n in nodes),
            "total_bytes": sum(n["bytes"] for n in nodes), "bottleneck_mix": mix,
            "time_by_bottleneck_s": tb,
            "kernel_class_counts": {c: sum(n["kernel_class"] == c for n in nodes) for c in classes},
            "time_by_kernel_class_s": {c: sum(n["est_time_s"] for n in nodes
                                              if n["kernel_class"] == c) for c in classes},
            "patterns": {"attention": 1, "rmsnorm": 1},
            "costliest_nodes": [{"name": n["name"], "kernel_class": n["kernel_class"],
                                 "est_time_s": n["est_time_s"], "share": n["est_time_s"] / total}
                                for n in costly],
            "unsupported_ops": {"WeirdOp": 1}, "flagged_nodes": {"dynamic_shape": 1}}


def make_multi() -> dict[str, Any]:
    return {"schema_version": 2, "plans": [make_plan("h100-sxm"), make_plan("a100-sxm")]}


def embedded_data(page: str) -> dict[str, Any]:
    """The page's JSON block, with its tables decoded into one ``fields`` row per node."""
    start = page.index(DATA_OPEN) + len(DATA_OPEN)
    data = json.loads(page[start:page.index("</script>", start)])
    return {**data, "rows": decode(data)}


def _reversed_dicts(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed_dicts(v) for k, v in reversed(list(value.items()))}
    if isinstance(value, list):
        return [_reversed_dicts(v) for v in value]
    return value


def _hostile_everywhere() -> tuple[dict[str, Any], list[str]]:
    """A plan with markup in every string a model or a caller can put in it (a kernel class
    and a decision kind are enums, so bad[1] goes where the plan holds free text: the
    summary's class keys and a costliest node's class)."""
    plan = make_optimized()
    bad = ["<img src=x onerror=alert(3)>", "<svg onload=alert(4)>", "<u>pat</u>", "<i>flag</i>",
           "<marquee>op</marquee>", "<em>dtype</em>", "<s>kind</s>", "<q>src</q>"]
    plan["target"] = {**plan["target"], "display_name": bad[0], "generation": bad[0]}
    plan["model"] = {**plan["model"], "name": bad[0], "source": bad[7]}
    node = plan["nodes"][0]
    node.update(pattern=bad[2], flags=[bad[3]], op=bad[4], op_type=bad[4], dtype=bad[5],
                dims={bad[6]: 1})
    node["cost"] = {**node["cost"], "note": bad[6]}
    node["decisions"] = {"precision": {"format": bad[6], "applied": True, "reason": bad[6]}}
    s = plan["summary"]
    s["unsupported_ops"] = {bad[4]: 1}
    s["flagged_nodes"] = {bad[3]: 1}
    s["patterns"] = {bad[2]: 1}
    s["time_by_kernel_class_s"] = {**s["time_by_kernel_class_s"], bad[1]: 1e-6}
    s["costliest_nodes"][0]["kernel_class"] = bad[1]
    plan["memory"]["notes"] = [bad[2]]
    plan["memory"]["breakdown"][0]["component"] = bad[3]
    plan["quantization"].update(display=bad[4], reason=bad[5])
    plan["quantization"]["alternatives"][0].update(format=bad[6], note=bad[7])
    plan["runtime_settings"]["sdpa_backends"] = {"value": bad[0], "reason": bad[2]}
    plan["optimization"]["passes_reverted"] = [{"pass": bad[3], "reason": bad[4]}]
    plan["optimization"]["notes"][bad[5]] = {bad[6]: bad[7], "n": [bad[0]]}
    return plan, bad


def typed(report: dict[str, Any]) -> Plan | PlanSet:
    """The typed plan (or plan set) a report dict holds: what the renderers take."""
    return PlanSet.from_json(report) if "plans" in report else Plan.from_json(report)
