"""How to run an optimized ONNX model, decided once from the plan and the target: the session
config (:class:`SessionConfig`) that ``graphopt.backends.onnx.session`` writes next to the model
(``<model>.graphopt.json``) and loads with ``ort_session``.

Layout is a runtime decision on ONNX: ONNX Conv is NCHW by definition, and ONNX Runtime's
CUDA EP runs NHWC kernels (transposing once at region boundaries) when its provider option
``prefer_nhwc`` is "1"; its CPU EP converts convs to its own blocked NCHWc layout at
``ORT_ENABLE_ALL`` whatever graphopt does. So the layout "pass" rewrites nothing: the session
follows the run's layout decision (:func:`graphopt.decisions.rewrites.decide_run_layout`,
the one the torch backend applies too) as provider options, and each conv's ``"layout"``
decision says where ORT differs from it (a ``backend`` field, recorded by the backend):

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

from dataclasses import dataclass, field
from typing import Any

from graphopt.decisions.layout.channels_last import LayoutPlan
from graphopt.decisions.memory_runtime.runtime import tf32_allowed
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.options import Options

__all__ = ["CONFIG_SUFFIX", "CPU_EP", "LEVELS", "MAX_THREADS", "SessionConfig",
           "decide_ort_session"]

CONFIG_SUFFIX = ".graphopt.json"
LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_LAYOUT",
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
        """The config ``to_dict`` wrote; GraphoptError naming the field on anything else (a
        list, a wrong type, a value out of range, a field graphopt does not write)."""
        fix = "write it with graphopt (optimize ... -o model.onnx)"
        if not isinstance(d, dict) or d.get("format") != "graphopt-ort-session":
            raise GraphoptError("not a graphopt session config (a JSON object with "
                                f"\"format\": \"graphopt-ort-session\"), got {_short(d)}", fix)
        unknown = sorted(str(k) for k in d if k not in _FIELDS)
        if unknown:  # a user's "inter_op_num_threads" would be silently ignored
            raise GraphoptError(f"field {_short(unknown[0])} is not one graphopt reads",
                                f"remove it; the fields are: {', '.join(_FIELDS)}")
        if d.get("version", 1) != 1 or type(d.get("version", 1)) is not int:
            raise GraphoptError(f"version is {_short(d.get('version'))}; this graphopt reads "
                                "version 1", fix)
        level = d.get("graph_optimization_level", "ORT_ENABLE_ALL")
        if not isinstance(level, str) or level not in LEVELS:
            raise GraphoptError(f"graph_optimization_level is {_short(level)}, not an ONNX "
                                f"Runtime level", f"use one of: {', '.join(LEVELS)}")
        threads = d.get("intra_op_num_threads")
        if threads is not None and (type(threads) is not int or
                                    not 1 <= threads <= MAX_THREADS):
            raise GraphoptError(f"intra_op_num_threads is {_short(threads)}, not a thread count "
                                f"(1 to {MAX_THREADS})",
                                f"give an integer from 1 to {MAX_THREADS} (more than this "
                                "machine's CPUs is lowered to them), or null for ORT's default")
        target, reasons = d.get("target", ""), d.get("reasons", {})
        if not isinstance(target, str) or len(target) > _MAX_TEXT:
            raise GraphoptError(f"target is {_short(target)}, not a target name (a string of "
                                f"at most {_MAX_TEXT} characters)", fix)
        if not isinstance(reasons, dict) or not all(
                isinstance(v, str) and len(v) <= 10 * _MAX_TEXT for v in reasons.values()):
            raise GraphoptError(f"reasons is {_short(reasons)}, not an object of strings", fix)
        return cls(target, _providers(d.get("providers", [])), level, threads, dict(reasons))


#: the most intra-op threads a config file may ask for: more is no machine's thread count (a
#: config asking for more than this machine has is lowered to it when loaded:
#: ``backends/onnx/session.session_settings``)
MAX_THREADS = 1024
_MAX_TEXT = 200
_FIELDS = ("format", "version", "target", "providers", "graph_optimization_level",
           "intra_op_num_threads", "reasons")
_MAX_PROVIDERS = 8


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _providers(raw: Any) -> tuple[tuple[str, dict[str, str]], ...]:
    """``[[name, {option: value}], ...]`` -> providers; GraphoptError on another shape."""
    fix = ('give "providers": [["CUDAExecutionProvider", {"use_tf32": "0"}], '
           '["CPUExecutionProvider", {}]] (name, options of strings)')
    if not isinstance(raw, list) or len(raw) > _MAX_PROVIDERS:
        raise GraphoptError(f"providers is {_short(raw)}, not a list of at most "
                            f"{_MAX_PROVIDERS} providers", fix)
    out = []
    for p in raw:
        if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                and isinstance(p[1], dict)):
            raise GraphoptError(f"provider entry {_short(p)} is not [name, options]", fix)
        if not p[0].endswith("ExecutionProvider") or len(p[0]) > _MAX_TEXT:
            raise GraphoptError(f"provider {_short(p[0])} is not an ONNX Runtime execution "
                                "provider name (e.g. CPUExecutionProvider)", fix)
        if not all(isinstance(v, (str, int, float)) and len(str(v)) <= _MAX_TEXT
                   for v in p[1].values()):
            raise GraphoptError(f"provider {p[0]}'s options {_short(p[1])} hold a value that "
                                "is not a string or number", fix)
        out.append((p[0], {str(k): str(v) for k, v in p[1].items()}))
    return tuple(out)


CPU_EP = "ORT's CPU EP picks its own blocked (NCHWc) conv layout; the graph stays NCHW"



def decide_ort_session(target: HardwareProfile, options: Options, compute_dtype: str,
                       layout: LayoutPlan, quantize_level: str | None = None) -> SessionConfig:
    """The session config for ``target``, following the run's layout decision (layout: cases
    1-3 of the module doc). ``quantize_level``: the graph optimization level the quantize pass
    asks for on the CPU EP (FP8 QDQ loads only below ORT_ENABLE_ALL)."""
    t, opts = target, options
    reasons: dict[str, str] = {}
    level = "ORT_ENABLE_ALL"
    if not t.is_gpu and quantize_level in LEVELS:
        level = quantize_level
        reasons["graph_optimization_level"] = f"{level}: the quantize pass asks for it"
    else:
        reasons["graph_optimization_level"] = "ORT_ENABLE_ALL: every fusion and layout transform"
    if not t.is_gpu:
        reasons["layout"] = f"case 1: CPU target, {CPU_EP} (the plan: {layout.reason})"
        reasons["intra_op_num_threads"] = (f"ORT's default: one per physical core of "
                                           f"{t.display_name} ({t.cores})")
        return SessionConfig(t.name, (("CPUExecutionProvider", {}),), level, None, reasons)
    cuda: dict[str, str] = {}
    if layout.nhwc:
        cuda["prefer_nhwc"] = "1"
        reasons["layout"] = (f"case 2: {layout.reason}; convs on tensor cores read NHWC, "
                             "prefer_nhwc saves cuDNN's per-conv NCHW<->NHWC transposes")
    else:
        reasons["layout"] = f"case {3 if opts.layout == 'keep' or not layout.convs else 2}: " \
            f"{layout.reason}"
    tf32 = compute_dtype == "tf32" or tf32_allowed(t, opts.precision)
    cuda["use_tf32"] = "1" if tf32 else "0"
    reasons["use_tf32"] = ("TF32 tensor cores for fp32 GEMMs/convs" if tf32 else
                           "IEEE fp32: precision='fp32' or no TF32 units")
    if layout.convs:
        cuda["cudnn_conv_algo_search"] = "EXHAUSTIVE"
        reasons["cudnn_conv_algo_search"] = "static-shape conv net: cuDNN autotunes once"
    return SessionConfig(t.name, (("CUDAExecutionProvider", cuda), ("CPUExecutionProvider", {})),
                         level, None, reasons)
