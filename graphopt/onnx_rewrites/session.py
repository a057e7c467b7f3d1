"""How to run an optimized ONNX model: the session config written next to it
(``<model>.graphopt.json``) and :func:`ort_session`, which loads it.

Layout is a runtime decision on ONNX: ONNX Conv is NCHW by definition, and ONNX Runtime's
CUDA EP runs NHWC kernels (transposing once at region boundaries) when its provider option
``prefer_nhwc`` is "1"; its CPU EP converts convs to its own blocked NCHWc layout at
``ORT_ENABLE_ALL`` whatever graphopt does. So the layout "pass" rewrites nothing: it decides
the provider options, with the torch layout pass's rules:

1. ``layout="keep"``, or a CPU target: no NHWC option (CPU: ORT's NCHWc transformer decides).
2. GPU target with convs running on tensor cores (fp16/bf16, or fp32 as TF32 on sm_80+):
   NHWC is what the tensor-core kernels read; cuDNN transposes NCHW in and out of each one
   (NVIDIA, "Convolutional Layers User's Guide", NCHW vs NHWC). ``prefer_nhwc`` = "1" unless
   grouped convs with more than one channel per group (cuDNN's slow NHWC grouped kernels,
   pytorch/pytorch#70954) dominate the convs' estimated time (case 3 of the torch pass).
3. ``layout="channels_last"``: NHWC whenever there are convs, paying or not.

Other settings: CUDA EP ``use_tf32`` follows the precision decision (torch runtime rule 1) and
``cudnn_conv_algo_search`` = EXHAUSTIVE for static-shape conv nets (rule 2); graph
optimization ``ORT_ENABLE_ALL`` unless a pass asks for less (FP8 QDQ on the CPU EP).

CPU intra-op threads: ORT's default, one per physical core (torch runtime rule 6). graphopt
tried a rule (one thread when ops estimated under 20 us dominate) and timing the choice on
this machine, and dropped both: on the shared 2-core development VM the 1-vs-2-thread winner
flipped with other jobs' load (0.79x to 2.2x for the same small models, bench_onnx_cpu.py),
and identical configs timed up to 15% apart, so any override was a coin flip.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from graphopt.analysis.kernel_class import KernelClass
from graphopt.errors import GraphoptError
from graphopt.onnx_rewrites.context import OnnxContext

__all__ = ["CONFIG_SUFFIX", "SessionConfig", "config_path", "decide_session", "ort_session",
           "render_config"]

logger = logging.getLogger(__name__)

CONFIG_SUFFIX = ".graphopt.json"
_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_LAYOUT",
           "ORT_ENABLE_ALL")


@dataclass(frozen=True)
class SessionConfig:
    """Providers (in order, with options), graph optimization level, threads, and why."""

    target: str
    providers: tuple[tuple[str, dict[str, str]], ...]
    graph_optimization_level: str = "ORT_ENABLE_ALL"
    intra_op_num_threads: int | None = None
    reasons: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": "graphopt-ort-session", "version": 1, "target": self.target,
                "providers": [[name, dict(opts)] for name, opts in self.providers],
                "graph_optimization_level": self.graph_optimization_level,
                "intra_op_num_threads": self.intra_op_num_threads,
                "reasons": dict(self.reasons)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionConfig:
        if d.get("format") != "graphopt-ort-session":
            raise GraphoptError("not a graphopt session config",
                                "write it with graphopt (optimize ... -o model.onnx)")
        level = str(d.get("graph_optimization_level", "ORT_ENABLE_ALL"))
        if level not in _LEVELS:
            raise GraphoptError(f"unknown graph optimization level {level!r}",
                                f"use one of: {', '.join(_LEVELS)}")
        provs = tuple((str(p[0]), {str(k): str(v) for k, v in dict(p[1]).items()})
                      for p in d.get("providers", []))
        threads = d.get("intra_op_num_threads")
        return cls(str(d.get("target", "")), provs, level,
                   None if threads is None else int(threads), dict(d.get("reasons", {})))


def _conv_time(ctx: OnnxContext) -> tuple[float, float]:
    """(estimated time of all convs, of grouped convs with > 1 channel per group)."""
    total = grouped = 0.0
    for n in ctx.plan.nodes:
        if n.analysis.kernel_class is not KernelClass.CONV:
            continue
        total += n.cost.est_time_s
        groups = int(n.analysis.dims.get("groups", 1) or 1)
        c_in = int(n.analysis.dims.get("C_in", 0) or 0)
        if groups > 1 and c_in and c_in // groups > 1:
            grouped += n.cost.est_time_s
    return total, grouped


def decide_session(model: onnx.ModelProto, ctx: OnnxContext) -> SessionConfig:
    """The session config for ``ctx.target`` (cases 1-3 of the module doc)."""
    t, opts = ctx.target, ctx.options
    reasons: dict[str, str] = {}
    level = "ORT_ENABLE_ALL"
    q = ctx.notes.get("quantize") or {}
    if not t.is_gpu and q.get("ort_cpu_graph_optimization_level") in _LEVELS:
        level = q["ort_cpu_graph_optimization_level"]
        reasons["graph_optimization_level"] = f"{level}: the quantize pass asks for it"
    else:
        reasons["graph_optimization_level"] = "ORT_ENABLE_ALL: every fusion and layout transform"
    if not t.is_gpu:
        reasons["layout"] = ("case 1: CPU target, ORT's CPU EP picks its own blocked (NCHWc) "
                             "conv layout at ORT_ENABLE_ALL; the graph stays NCHW")
        reasons["intra_op_num_threads"] = (f"ORT's default: one per physical core of "
                                           f"{t.display_name} ({t.cores})")
        return SessionConfig(t.name, (("CPUExecutionProvider", {}),), level, None, reasons)
    cuda: dict[str, str] = {}
    total, grouped = _conv_time(ctx)
    tensor_cores = ctx.compute_dtype in ("fp16", "bf16") or (
        ctx.compute_dtype == "tf32" and t.has("tf32"))
    if opts.layout == "keep" or total == 0.0:
        reasons["layout"] = ("case 1: layout='keep'" if opts.layout == "keep"
                             else "no convolutions: layout does not matter")
    elif opts.layout == "channels_last":
        cuda["prefer_nhwc"] = "1"
        reasons["layout"] = "case 3: layout='channels_last' requested: NHWC conv kernels"
    elif not tensor_cores:
        reasons["layout"] = (f"case 2: convs run in {ctx.compute_dtype} without tensor cores on "
                             f"{t.display_name}: NCHW kernels, no transposes")
    elif grouped > 0.5 * total:
        reasons["layout"] = (f"case 2: grouped convs are {grouped / total:.0%} of the conv time "
                             "and cuDNN's NHWC grouped kernels are slow (pytorch#70954)")
    else:
        cuda["prefer_nhwc"] = "1"
        reasons["layout"] = (f"case 2: {ctx.compute_dtype} convs on tensor cores read NHWC; "
                             "prefer_nhwc saves cuDNN's per-conv NCHW<->NHWC transposes")
    tf32 = ctx.compute_dtype == "tf32" or (t.has("tf32") and opts.precision not in ("fp32",))
    cuda["use_tf32"] = "1" if tf32 else "0"
    reasons["use_tf32"] = ("TF32 tensor cores for fp32 GEMMs/convs" if tf32 else
                           "IEEE fp32: precision='fp32' or no TF32 units")
    if total > 0.0:
        cuda["cudnn_conv_algo_search"] = "EXHAUSTIVE"
        reasons["cudnn_conv_algo_search"] = "static-shape conv net: cuDNN autotunes once"
    return SessionConfig(t.name, (("CUDAExecutionProvider", cuda), ("CPUExecutionProvider", {})),
                         level, None, reasons)


def config_path(model_path: str | os.PathLike[str]) -> Path:
    """``out.onnx`` -> ``out.graphopt.json``."""
    p = Path(model_path)
    return p.with_name(p.stem + CONFIG_SUFFIX) if p.suffix else p.with_name(p.name + CONFIG_SUFFIX)


def render_config(config: SessionConfig) -> str:
    return json.dumps(config.to_dict(), indent=1, sort_keys=True) + "\n"



def ort_session(path: str | os.PathLike[str], providers: list[Any] | None = None) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``path`` with graphopt's session config.

    The config's providers are filtered to those this onnxruntime build has (a model planned
    for a GPU still loads on a CPU-only machine, on the CPU EP); ``providers`` overrides them.
    Without a config file: ORT's defaults.
    """
    import onnxruntime as ort

    model = Path(path)
    if not model.is_file():
        raise GraphoptError(f"model file {model} does not exist", "give the .onnx file's path")
    cfg_file = config_path(model)
    options = ort.SessionOptions()
    chosen: list[Any] = ["CPUExecutionProvider"]
    if cfg_file.is_file():
        try:
            cfg = SessionConfig.from_dict(json.loads(cfg_file.read_text()))
        except (OSError, ValueError, TypeError, KeyError, IndexError) as e:
            raise GraphoptError(f"cannot read the session config {cfg_file}: {e}",
                                "delete it or write it again with graphopt") from None
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                                   cfg.graph_optimization_level)
        if cfg.intra_op_num_threads:
            options.intra_op_num_threads = cfg.intra_op_num_threads
        have = set(ort.get_available_providers())
        chosen = [(n, o) for n, o in cfg.providers if n in have] or ["CPUExecutionProvider"]
        logger.info("session config %s: providers %s", cfg_file, chosen)
    if providers is not None:
        chosen = list(providers)
    try:
        return ort.InferenceSession(str(model), options, providers=chosen)
    except Exception as e:
        raise GraphoptError(f"ONNX Runtime cannot load {model}: {' '.join(str(e).split())[:300]}",
                            "check the model with onnx.checker.check_model(path, "
                            "full_check=True)") from None
