"""How to run an optimized ONNX model: the session config written next to it
(``<model>.graphopt.json``) and :func:`ort_session`, which loads it.

Layout is a runtime decision on ONNX: ONNX Conv is NCHW by definition, and ONNX Runtime's
CUDA EP runs NHWC kernels (transposing once at region boundaries) when its provider option
``prefer_nhwc`` is "1"; its CPU EP converts convs to its own blocked NCHWc layout at
``ORT_ENABLE_ALL`` whatever graphopt does. So the layout "pass" rewrites nothing: it applies the
plan's layout decision (:func:`graphopt.decisions.layout.decide_layout`, the one the torch
backend applies too) as provider options, and each conv's ``"layout"`` decision says where ORT
differs from it (a ``backend`` field):

1. CPU target: no NHWC option; ORT's NCHWc transformer decides. Convs the plan would run
   channels_last are marked not applied, with that reason.
2. GPU target: ``prefer_nhwc`` = "1" when the plan's model-level decision is NHWC (the convs it
   runs channels_last hold at least half the conv time). The option is one per session, so
   convs the plan keeps NCHW run NHWC with the rest, and the reverse; their decisions say so.
3. ``layout="keep"``, or no convs: no NHWC option.

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

from graphopt.backends.onnx.context import OnnxContext
from graphopt.decisions.layout import LayoutPlan, decide_layout
from graphopt.errors import GraphoptError

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
    def from_dict(cls, d: Any) -> SessionConfig:
        """The config ``to_dict`` wrote; GraphoptError on anything else (a list, a wrong type)."""
        fix = "write it with graphopt (optimize ... -o model.onnx)"
        if not isinstance(d, dict) or d.get("format") != "graphopt-ort-session":
            raise GraphoptError("not a graphopt session config (a JSON object with "
                                f"\"format\": \"graphopt-ort-session\"), got {_short(d)}", fix)
        level = d.get("graph_optimization_level", "ORT_ENABLE_ALL")
        if not isinstance(level, str) or level not in _LEVELS:
            raise GraphoptError(f"unknown graph optimization level {_short(level)}",
                                f"use one of: {', '.join(_LEVELS)}")
        threads = d.get("intra_op_num_threads")
        if threads is not None and (type(threads) is not int or
                                    not 1 <= threads <= _MAX_THREADS):
            raise GraphoptError(f"intra_op_num_threads is {_short(threads)}, not a thread count",
                                f"give an integer from 1 to {_MAX_THREADS}, or null for ORT's "
                                "default")
        target, reasons = d.get("target", ""), d.get("reasons", {})
        if not isinstance(target, str) or not isinstance(reasons, dict):
            raise GraphoptError(f"target {_short(target)} or reasons {_short(reasons)} has the "
                                "wrong type (a string, an object)", fix)
        return cls(target, _providers(d.get("providers", [])), level, threads,
                   {str(k): str(v) for k, v in reasons.items()})


#: a session config is a few hundred bytes; one past this is not a file graphopt wrote
_CONFIG_MAX_BYTES = 1 << 20
_MAX_THREADS = 4096


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _providers(raw: Any) -> tuple[tuple[str, dict[str, str]], ...]:
    """``[[name, {option: value}], ...]`` -> providers; GraphoptError on another shape."""
    fix = ('give "providers": [["CUDAExecutionProvider", {"use_tf32": "0"}], '
           '["CPUExecutionProvider", {}]] (name, options of strings)')
    if not isinstance(raw, list):
        raise GraphoptError(f"providers is {_short(raw)}, not a list", fix)
    out = []
    for p in raw:
        if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                and isinstance(p[1], dict)):
            raise GraphoptError(f"provider entry {_short(p)} is not [name, options]", fix)
        if not all(isinstance(v, (str, int, float)) for v in p[1].values()):
            raise GraphoptError(f"provider {p[0]}'s options {_short(p[1])} hold a value that "
                                "is not a string or number", fix)
        out.append((p[0], {str(k): str(v) for k, v in p[1].items()}))
    return tuple(out)


_CPU_EP = "ORT's CPU EP picks its own blocked (NCHWc) conv layout; the graph stays NCHW"


def _record(ctx: OnnxContext, layout: LayoutPlan, nhwc: bool | None) -> None:
    """Each conv's plan decision, applied where ORT runs it so (``nhwc``: the session's
    prefer_nhwc; None on the CPU EP, which runs neither)."""
    for name, d in layout.convs.items():
        fields = d.fields()
        if nhwc is None:
            if d.channels_last:
                fields["backend"] = f"case 1: {_CPU_EP}"
            ctx.decide(name, "layout", d.reason, applied=False, **fields)
            continue
        if d.channels_last != nhwc and layout.mode != "keep":
            fields["backend"] = ("case 2: prefer_nhwc is one option per session: ORT runs "
                                 f"this conv {'NHWC' if nhwc else 'NCHW'} with the rest")
        ctx.decide(name, "layout", d.reason, applied=d.channels_last and nhwc, **fields)


def decide_session(model: onnx.ModelProto, ctx: OnnxContext) -> SessionConfig:
    """The session config for ``ctx.target`` (layout: cases 1-3 of the module doc)."""
    t, opts = ctx.target, ctx.options
    reasons: dict[str, str] = {}
    level = "ORT_ENABLE_ALL"
    q = ctx.notes.get("quantize") or {}
    if not t.is_gpu and q.get("ort_cpu_graph_optimization_level") in _LEVELS:
        level = q["ort_cpu_graph_optimization_level"]
        reasons["graph_optimization_level"] = f"{level}: the quantize pass asks for it"
    else:
        reasons["graph_optimization_level"] = "ORT_ENABLE_ALL: every fusion and layout transform"
    layout = decide_layout(ctx.plan, t, ctx.compute_dtype, opts.layout)
    ctx.notes["layout"] = {"decision": {"nhwc": layout.nhwc, "reason": layout.reason}}
    if not t.is_gpu:
        _record(ctx, layout, None)
        reasons["layout"] = f"case 1: CPU target, {_CPU_EP} (the plan: {layout.reason})"
        reasons["intra_op_num_threads"] = (f"ORT's default: one per physical core of "
                                           f"{t.display_name} ({t.cores})")
        return SessionConfig(t.name, (("CPUExecutionProvider", {}),), level, None, reasons)
    cuda: dict[str, str] = {}
    _record(ctx, layout, layout.nhwc)
    if layout.nhwc:
        cuda["prefer_nhwc"] = "1"
        reasons["layout"] = (f"case 2: {layout.reason}; convs on tensor cores read NHWC, "
                             "prefer_nhwc saves cuDNN's per-conv NCHW<->NHWC transposes")
    else:
        reasons["layout"] = f"case {3 if opts.layout == 'keep' or not layout.convs else 2}: " \
            f"{layout.reason}"
    tf32 = ctx.compute_dtype == "tf32" or (t.has("tf32") and opts.precision not in ("fp32",))
    cuda["use_tf32"] = "1" if tf32 else "0"
    reasons["use_tf32"] = ("TF32 tensor cores for fp32 GEMMs/convs" if tf32 else
                           "IEEE fp32: precision='fp32' or no TF32 units")
    if layout.convs:
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
    cfg = _load_config(cfg_file)
    if cfg is not None:
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


def _load_config(path: Path) -> SessionConfig | None:
    """The session config at ``path``, None when there is none; GraphoptError naming the file
    when it is not one graphopt wrote (not a regular file, too big, not JSON, malformed)."""
    fix = (f"delete {path} (ORT's defaults then apply) or write it again with graphopt "
           "(optimize ... -o model.onnx)")
    if not path.is_file():
        if path.exists() or path.is_symlink():  # a folder, a FIFO, a device, a dangling link
            raise GraphoptError(f"the session config {path} is not a regular file", fix)
        return None
    try:
        with path.open("rb") as f:  # read at most the limit: a size on disk can lie
            raw = f.read(_CONFIG_MAX_BYTES + 1)
        if len(raw) > _CONFIG_MAX_BYTES:
            raise GraphoptError(f"the session config {path} is over {_CONFIG_MAX_BYTES:,} "
                                "bytes; graphopt writes a few hundred", fix)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise GraphoptError(f"cannot read the session config {path}: "
                            f"{type(e).__name__}: {str(e)[:200]}", fix) from None
    try:
        return SessionConfig.from_dict(data)
    except GraphoptError as e:
        raise GraphoptError(f"the session config {path} is malformed: {e.problem}", fix) from None
