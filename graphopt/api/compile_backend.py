"""``torch.compile(model, backend="graphopt", options={...})``: graphopt's decisions per graph.

For each graph dynamo captures (one per side of a graph break, again on a recompile), graphopt
plans and applies its decisions for the target (``graphopt.optimize`` on the graph with its
weights bound, :mod:`graphopt.api.compile_graph`), checks the numbers as ``optimize`` does, and
hands the rewritten graph to Inductor for codegen (``runtime="inductor"``), runs it as is
(``"eager"``), or deploys the artifact graphopt's own deploy decision picks (``"deploy"``).
Guards, graph breaks and recompiles are dynamo's, as with Inductor; a symbolic graph
(``dynamic=True``, or dynamo's automatic dynamic shapes on a recompile) is optimized over its
symbolic dims and stays symbolic. Whatever graphopt cannot do with a graph (an op it cannot
trace, a dim it would have to specialize, a training graph, an error) never breaks the user's
compile: that graph goes to plain Inductor, and :func:`graphopt.last_plan` says why.

Timing candidates is off by default (``measure=False``): a compile must not spend tens of
seconds timing; ``options={"measure": True}`` turns it on.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch._dynamo.backends.registry  # noqa: F401 - register_dynamo_backend names it there
from torch import fx
from torch._guards import CompileContext, detect_fake_mode, tracing
from torch._subclasses.fake_tensor import disable_fake_tensor_cache

from graphopt.api.compile_graph import (
    FrozenGraph,
    GraphInputs,
    cannot_optimize,
    dynamic_spec,
    dynamo_callable,
    graph_inputs,
)
from graphopt.api.compile_plans import (
    BACKEND_NAME,
    CompiledGraph,
    record_graph,
    register_dynamo_backend,
)
from graphopt.api.deploy import relaxed
from graphopt.api.optimized import Optimized, optimize
from graphopt.backends.torch.verify import compare_outputs
from graphopt.errors import GraphoptError, first_line
from graphopt.hardware.detect import detected_gpu_profiles
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.options import Options

__all__ = ["OPTIONS", "RUNTIMES", "graphopt_backend", "starts_compile"]

logger = logging.getLogger(__name__)

#: what runs graphopt's graph: Inductor's codegen, graphopt's module itself, or the artifact
#: graphopt's deploy decision picks (``Optimized.deploy``; static graphs only)
RUNTIMES = ("inductor", "eager", "deploy")
#: the keys ``options`` takes: graphopt.optimize's own, the runtime, and Inductor's config
OPTIONS = ("target", "precision", "pad", "layout", "quantize", "tolerance", "measure",
           "runtime", "inductor")
_TORCH_DIR = str(Path(torch.__file__).parent)
_OWN_DIR = str(Path(__file__).parents[1])
_STDLIB = sysconfig.get_paths()["stdlib"]
#: installed packages (transformers' models): the user's code, even where under the stdlib's
_PACKAGES = (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])


@dataclass(frozen=True)
class Settings:
    """The backend's options, checked once per graph before anything runs."""

    target: str | HardwareProfile | None = None
    optimize: dict[str, Any] = field(default_factory=dict)
    runtime: str = "inductor"
    inductor: dict[str, Any] = field(default_factory=dict)


def settings(options: Mapping[str, Any] | None, mode: str | None = None,
             dynamic: bool = False) -> Settings:
    """``options`` checked: an unknown key or value is a GraphoptError naming the valid ones."""
    opts = dict(options or {})
    unknown = sorted(k for k in opts if k not in OPTIONS)
    if unknown:
        raise GraphoptError(f"torch.compile(backend={BACKEND_NAME!r}) got unknown option(s) "
                            f"{', '.join(map(repr, unknown))}",
                            f"use {', '.join(OPTIONS)} (Inductor's own config goes under "
                            "'inductor': {...})")
    runtime = opts.pop("runtime", "inductor")
    if runtime not in RUNTIMES:
        raise GraphoptError(f"runtime={runtime!r} is not a graphopt backend runtime",
                            f"use one of: {', '.join(RUNTIMES)}")
    inductor = dict(opts.pop("inductor", None) or {})
    if mode and mode != "default":
        from torch._inductor import list_mode_options

        inductor = {**list_mode_options(mode, dynamic), **inductor}
    target = opts.pop("target", None)
    opts.setdefault("measure", False)  # module doc: no timing by default
    Options(**opts)  # checks each value now, with optimize's own messages
    return Settings(target, opts, runtime, inductor)


def default_target(example_inputs: Sequence[Any]) -> str | HardwareProfile:
    """The GPU the graph's tensors are on, else this machine's CPU ("cpu")."""
    device = next((t.device for t in example_inputs
                   if isinstance(t, torch.Tensor) and t.device.type == "cuda"), None)
    if device is None:
        return "cpu"
    gpus = detected_gpu_profiles()
    index = device.index or 0
    return gpus[index] if index < len(gpus) else "cpu"


def starts_compile() -> bool:
    """Whether this graph starts a new compile (:mod:`.compile_plans`): False for a graph
    break's continuation, which dynamo compiles while the compiled call that reached the break
    still runs, so a frame of the user's code (the model's ``forward``) sits on the stack
    between this backend and torch's compiled entry (``compile_wrapper``)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "compile_wrapper" and \
                frame.f_code.co_filename.startswith(_TORCH_DIR):
            return True
        if not _machinery(frame.f_code.co_filename):
            return False
        frame = frame.f_back
    return True


def _machinery(path: str) -> bool:
    """A frame of torch, graphopt or the standard library: not the user's code that a graph
    break resumes in."""
    return path.startswith((_TORCH_DIR, _OWN_DIR)) or (
        path.startswith(_STDLIB) and not path.startswith(_PACKAGES))


def _compile_id() -> str:
    cid = CompileContext.current_compile_id()
    return "?" if cid is None else str(cid)


def graphopt_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                     mode: str | None = None,
                     options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The ``torch.compile`` backend (module doc); ``options`` as :data:`OPTIONS` lists:
    ``target`` (default: the GPU the tensors are on, else "cpu"), optimize's ``precision``,
    ``pad``, ``layout``, ``quantize``, ``tolerance``, ``measure`` (default False), ``runtime``
    (:data:`RUNTIMES`) and ``inductor`` (Inductor config patches; ``mode`` as torch.compile's)."""
    symbolic = any(isinstance(a, torch.SymInt) for a in example_inputs)
    chosen = settings(options, mode, symbolic)
    new = starts_compile()
    cid, start = _compile_id(), time.perf_counter()
    why = cannot_optimize(gm, example_inputs)
    sorted_inputs = graph_inputs(gm) if why is None else why
    if isinstance(sorted_inputs, str):
        why = sorted_inputs
    else:
        try:
            done = _optimized(gm, example_inputs, sorted_inputs, chosen)
        except Exception as e:  # noqa: BLE001 - module doc: never break the user's compile
            logger.debug("graphopt could not optimize graph %s", cid, exc_info=True)
            why = f"{type(e).__name__}: {_reason(e)}"
        else:
            record_graph(CompiledGraph(cid, done.runtime, done.plan, None, sorted_inputs.dynamic,
                                       time.perf_counter() - start, done.note),
                         new_compile=new)
            logger.info("graphopt optimized graph %s (%s)", cid, done.runtime)
            return done.compiled
    logger.info("graphopt left graph %s to Inductor: %s", cid, why)
    record_graph(CompiledGraph(cid, "inductor", None, why), new_compile=new)
    return _inductor(gm, example_inputs, chosen)


def _reason(e: BaseException) -> str:
    return e.problem if isinstance(e, GraphoptError) else first_line(e)


def _inductor(gm: fx.GraphModule, example_inputs: Sequence[Any], chosen: Settings) -> Any:
    """Inductor's codegen for ``gm``. A graph holding packed weights (torch.ScriptObject: the
    dynamic INT8 Linear's) is compiled with the fake tensor cache and the FX graph cache off:
    the first compares its arguments, and a packed-weight object has no ``__eq__``; the second
    hashes the graph's constants, and a quantized tensor cannot be hashed (torch 2.13:
    NotImplementedError, "load_scalar: invalid type"). Compiling without them handles it."""
    from torch._inductor.compile_fx import compile_fx

    packed = any(isinstance(v, torch.ScriptObject) for m in gm.modules()
                 for v in vars(m).values())
    fake_mode = detect_fake_mode(example_inputs) if packed else None
    patches = {**chosen.inductor, "fx_graph_cache": False} if packed else chosen.inductor
    with contextlib.ExitStack() as stack:
        if packed:  # dynamo's own fake mode when there is one, else the one Inductor makes
            stack.enter_context(torch._dynamo.config.patch(fake_tensor_cache_enabled=False))
        if fake_mode is not None:
            stack.enter_context(disable_fake_tensor_cache(fake_mode))
        return compile_fx(gm, example_inputs, config_patches=patches or None)


def _real(value: Any) -> Any:
    """A size input's value to run with (its hint: the size dynamo traced at)."""
    return int(value.node.hint) if isinstance(value, torch.SymInt) else value


@dataclass(frozen=True)
class _Done:
    runtime: str
    compiled: Callable[..., Any]
    plan: Any
    note: str | None = None


def _optimized(gm: fx.GraphModule, example_inputs: Sequence[Any], sorted_inputs: GraphInputs,
               chosen: Settings) -> _Done:
    """graphopt's graph for dynamo, handed to its runtime and checked; or an exception."""
    frozen = FrozenGraph(gm, sorted_inputs, example_inputs)
    inputs = tuple(example_inputs[i] for i in sorted_inputs.inputs)
    target = chosen.target or default_target(example_inputs)
    dynamic = dynamic_spec(sorted_inputs)
    with tracing(None), torch.no_grad():  # graphopt traces and runs outside dynamo's context
        opt = optimize(frozen, inputs, target, dynamic_shapes=dynamic, **chosen.optimize)
        reference = frozen(*inputs)
    runtime = _runtime(chosen.runtime, opt, dynamic is not None)
    note = None
    if runtime == "inductor" and _nothing_for_inductor(gm, opt):
        compiled = _inductor(gm, example_inputs, chosen)
        note = ("graphopt's rewrites here are ones Inductor makes itself (dropout dropped, no "
                "BatchNorm to fold): the captured graph goes to Inductor as it is")
    elif runtime in ("eager", "inductor"):
        module = opt.module.graph_module if hasattr(opt.module, "graph_module") else opt.module
        wrapped = dynamo_callable(gm, module, sorted_inputs)
        compiled: Callable[..., Any] = _no_grad(wrapped)
        if runtime == "inductor":
            try:
                compiled = _inductor(wrapped, example_inputs, chosen)
            except Exception as e:  # noqa: BLE001 - graphopt's module runs as it is, checked
                logger.debug("Inductor could not compile graphopt's graph", exc_info=True)
                runtime, note = "eager", (f"Inductor could not compile graphopt's graph "
                                          f"({type(e).__name__}: {_reason(e)}): it runs as "
                                          "graphopt's module")
    else:
        compiled = _deployed(opt, sorted_inputs)
    with tracing(None), torch.no_grad():
        outputs = compiled(*[_real(a) for a in example_inputs])
    _check(reference, outputs, opt, runtime)
    return _Done(runtime, compiled, opt.plan, note)


def _nothing_for_inductor(gm: fx.GraphModule, opt: Optimized) -> bool:
    """Whether graphopt applied nothing Inductor does not do itself: no pass but the cleanup,
    and no BatchNorm for it to fold (Inductor folds one only when freezing). Its exported,
    decomposed graph then only costs Inductor its own pattern matches on the captured one:
    measured 0.87-0.98x Inductor on BERT and ViT (benchmarks/bench_compile_backend.py)."""
    if not set(opt.info.passes_applied) <= {"cleanup"}:
        return False
    for n in gm.graph.nodes:
        if n.op == "call_module" and isinstance(gm.get_submodule(n.target),
                                                torch.nn.modules.batchnorm._BatchNorm):
            return False
        if n.op in ("call_function", "call_method") and "batch_norm" in str(n.target):
            return False
    return True


def _runtime(asked: str, opt: Optimized, symbolic: bool) -> str:
    """The runtime for ``asked``: "deploy" is the artifact graphopt's deploy decision picks
    (torch -> eager, torch.compile -> Inductor); an ONNX artifact, exported at one shape,
    runs a symbolic graph in Inductor instead."""
    if asked != "deploy":
        return asked
    artifact = str(opt.deploy.artifact) if opt.deploy is not None else "torch"
    runtime = {"torch": "eager", "torch.compile": "inductor"}.get(artifact, artifact)
    return "inductor" if symbolic and runtime not in ("eager", "inductor") else runtime


def _no_grad(module: torch.nn.Module) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        with torch.no_grad():
            return module(*args)
    return run


def _deployed(opt: Optimized, sorted_inputs: GraphInputs) -> Callable[..., Any]:
    """The deploy artifact (an ONNX Runtime or OpenVINO session) called with dynamo's
    arguments; it returns a tuple as dynamo's graph does."""
    runner = opt.deployed()
    picks = sorted_inputs.inputs

    def run(*args: Any) -> tuple[Any, ...]:
        out = runner(*[args[i] for i in picks])
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return run


def _check(reference: Any, outputs: Any, opt: Optimized, runtime: str) -> None:
    """The handed-off graph's outputs against dynamo's graph's, within graphopt's stated
    tolerance (at least a compiler's reordering): a handoff that breaks numbers raises, and
    the graph falls back to Inductor as it was."""
    result = compare_outputs(tuple(reference), tuple(outputs), relaxed(opt.info.tolerance))
    if not all(c.within for c in result):
        raise GraphoptError(f"graphopt's graph in {runtime} left the tolerance: "
                            + "; ".join(c.describe() for c in result if not c.within))


register_dynamo_backend()  # importing this module names the backend, as the entry point does
