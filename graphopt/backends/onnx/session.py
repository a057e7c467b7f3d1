"""The ONNX Runtime session an optimized model runs in: the config written next to it
(``<model>.graphopt.json``) and :func:`ort_session`, which loads it.

What the config says is decided in :mod:`graphopt.decisions.memory_runtime.ort_session` (layout,
TF32, cuDNN algorithm search, graph optimization level, threads); this module records each conv's
layout
decision as ORT will run it (a ``backend`` field where ORT differs from the plan) and reads and
writes the file.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import onnx

from graphopt.backends.onnx.context import OnnxContext
from graphopt.decisions.layout.channels_last import LayoutPlan
from graphopt.decisions.memory_runtime.ort_session import (
    CONFIG_SUFFIX,
    CPU_EP,
    SessionConfig,
    decide_ort_session,
)
from graphopt.decisions.rewrites import DryRunContext
from graphopt.errors import GraphoptError
from graphopt.files.read import check_regular, read_small_json

__all__ = ["config_path", "decide_session", "device_providers", "host_cpus", "ort_session",
           "record_layout", "render_config", "session_settings"]

logger = logging.getLogger(__name__)

#: a session config is a few hundred bytes; one past this is not a file graphopt wrote
_CONFIG_MAX_BYTES = 1 << 20


def record_layout(ctx: OnnxContext | DryRunContext, layout: LayoutPlan) -> None:
    """Each conv's layout decision, applied where ORT runs it so: on a GPU as the session's
    ``prefer_nhwc`` (``layout.nhwc``) runs it, on the CPU EP neither (it picks its own)."""
    nhwc = layout.nhwc if ctx.target.is_gpu else None
    for name, d in layout.convs.items():
        if nhwc is None:
            backend = f"case 1: {CPU_EP}" if d.channels_last else None
            ctx.decide(name, d.detail(backend), d.reason, applied=False)
            continue
        backend = None
        if d.channels_last != nhwc and layout.mode != "keep":
            backend = ("case 2: prefer_nhwc is one option per session: ORT runs "
                       f"this conv {'NHWC' if nhwc else 'NCHW'} with the rest")
        ctx.decide(name, d.detail(backend), d.reason, applied=d.channels_last and nhwc)


def decide_session(model: onnx.ModelProto, ctx: OnnxContext) -> SessionConfig:
    """The plan's session decision (:func:`decide_ort_session`) for this run, with each
    conv's layout decision recorded as ORT will run it."""
    q = ctx.notes.get("quantize") or {}
    layout = ctx.layout
    assert layout is not None  # decided when the context was made
    config = decide_ort_session(ctx.target, ctx.options, ctx.compute_dtype, layout,
                                q.get("ort_cpu_graph_optimization_level"))
    ctx.notes["layout"] = {"decision": {"nhwc": layout.nhwc, "reason": layout.reason}}
    record_layout(ctx, layout)
    return config


def config_path(model_path: str | os.PathLike[str]) -> Path:
    """``out.onnx`` -> ``out.graphopt.json``."""
    p = Path(model_path)
    return p.with_name(p.stem + CONFIG_SUFFIX) if p.suffix else p.with_name(p.name + CONFIG_SUFFIX)


def render_config(config: SessionConfig) -> str:
    return json.dumps(config.to_dict(), indent=1, sort_keys=True) + "\n"



def ort_session(path: str | os.PathLike[str], providers: list[Any] | None = None,
                device: Any = None) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``path`` with graphopt's session config.

    The config's providers are filtered to those this onnxruntime build has (a model planned
    for a GPU still loads on a CPU-only machine, on the CPU EP); ``device`` ("cpu", "cuda",
    "cuda:1") picks the provider for that device instead, and is an error where this
    onnxruntime has none (never a CPU session for a GPU asked for); ``providers`` overrides
    both. Without a config file: ORT's defaults.
    """
    import onnxruntime as ort

    model = Path(path)
    check_regular(model, f"the model file {model}", "give the .onnx file's path",
                  missing=f"model file {model} does not exist")
    cfg_file = config_path(model)
    cfg = _load_config(cfg_file)
    options, chosen = session_settings(cfg, providers, cfg_file)
    if device is not None and providers is None:
        chosen = device_providers(device, cfg)
    if cfg is not None:
        logger.info("session config %s: providers %s", cfg_file, chosen)
    try:
        session = ort.InferenceSession(str(model), options, providers=chosen)
    except Exception as e:
        raise GraphoptError(f"ONNX Runtime cannot load {model}: {' '.join(str(e).split())[:300]}",
                            "check the model with onnx.checker.check_model(path, "
                            "full_check=True)") from None
    first = chosen[0][0] if isinstance(chosen[0], tuple) else chosen[0]
    if device is not None and providers is None and first not in session.get_providers():
        raise GraphoptError(f"ONNX Runtime could not start {first} for device {str(device)!r} "
                            f"(the session has only {', '.join(session.get_providers())})",
                            "check the device's driver and the CUDA libraries onnxruntime "
                            "needs, or load with device='cpu'")
    return session


def host_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def session_settings(cfg: SessionConfig | None, providers: list[Any] | None = None,
                     source: str | os.PathLike[str] = "the session config"
                     ) -> tuple[Any, list[Any]]:
    """(``SessionOptions``, providers) as ``cfg`` says (ORT's defaults without one): its
    providers filtered to those this onnxruntime build has; ``providers`` overrides them.

    A thread count above this machine's CPUs (:func:`host_cpus`; a folder written on a larger
    machine) is lowered to them with a warning: more threads than CPUs only contend, and a
    file asking for thousands made ORT start them all."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    chosen: list[Any] = ["CPUExecutionProvider"]
    if cfg is not None:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                                   cfg.graph_optimization_level)
        if cfg.intra_op_num_threads:
            cpus = host_cpus()
            if cfg.intra_op_num_threads > cpus:
                logger.warning("%s: intra_op_num_threads %d is more than this machine's %d "
                               "CPUs; using %d", source, cfg.intra_op_num_threads, cpus, cpus)
            options.intra_op_num_threads = min(cfg.intra_op_num_threads, cpus)
        have = set(ort.get_available_providers())
        chosen = [(n, o) for n, o in cfg.providers if n in have] or ["CPUExecutionProvider"]
    return options, list(providers) if providers is not None else chosen


def device_providers(device: Any, cfg: SessionConfig | None = None) -> list[Any]:
    """The ORT providers that run on ``device`` ("cpu", "cuda", "cuda:N", a torch.device),
    with the config's options for that provider; GraphoptError for a string that is no
    device, a device ORT sessions do not run on here, or CUDA without ORT's CUDA provider."""
    import onnxruntime as ort

    text = str(device)
    found = re.fullmatch(r"(cpu|cuda)(?::(\d{1,4}))?", text)
    if found is None:
        known = re.fullmatch(r"[a-z_]+(?::\d{1,4})?", text) is not None
        raise GraphoptError(
            f"device {text[:60]!r} is " + ("not one ONNX Runtime sessions run on here" if known
                                            else "not a device (e.g. 'cpu', 'cuda', 'cuda:1')"),
            "give device='cpu' or device='cuda[:N]' for an ONNX model")
    name = "CPUExecutionProvider" if found[1] == "cpu" else "CUDAExecutionProvider"
    if name not in ort.get_available_providers():
        raise GraphoptError(f"device {text!r} asks for {name}, and this onnxruntime has none "
                            f"(it has {', '.join(ort.get_available_providers())})",
                            "pip uninstall onnxruntime && pip install onnxruntime-gpu (with a "
                            "CUDA its release supports), or load with device='cpu'")
    options = dict(next((o for n, o in cfg.providers if n == name), {})) if cfg else {}
    if found[2] is not None and name == "CUDAExecutionProvider":
        options["device_id"] = found[2]
    return [(name, options)] if name == "CPUExecutionProvider" else \
        [(name, options), "CPUExecutionProvider"]


def _load_config(path: Path) -> SessionConfig | None:
    """The session config at ``path``, None when there is none; GraphoptError naming the file
    when it is not one graphopt wrote (not a regular file, too big, not JSON, malformed)."""
    fix = (f"delete {path} (ORT's defaults then apply) or write it again with graphopt "
           "(optimize ... -o model.onnx)")
    if not path.exists():  # none: ORT's defaults (read_small_json says what else it is)
        if path.is_symlink():
            raise GraphoptError(f"the session config {path} is a link to nothing, not a "
                                "regular file", fix)
        return None
    data = read_small_json(path, _CONFIG_MAX_BYTES, f"the session config {path}", fix,
                           "graphopt writes a few hundred bytes")
    try:
        return SessionConfig.from_dict(data)
    except GraphoptError as e:
        raise GraphoptError(f"the session config {path} is malformed: {e.problem}", fix) from None
