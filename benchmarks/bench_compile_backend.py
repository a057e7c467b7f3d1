"""``torch.compile(model, backend="graphopt")`` against plain ``torch.compile`` (Inductor).

The zoo of ``bench_host_peers.py`` (BERT-base and GPT-2 with 4 layers at 128 tokens, a Llama
with hidden 1024 and 4 layers, ViT-base with 4 layers, ConvNeXt-T and ResNet-50 at 224x224;
random seeded weights, batch 1, SDPA attention). Per model, on the same inputs, each compiled
by its first call (compile seconds printed) and checked against eager:

* ``inductor fp32``: ``torch.compile(model)``, the reference of every ratio;
* ``graphopt fp32``: ``backend="graphopt", options={"precision": "fp32", "quantize": "none"}``:
  graphopt's exact rewrites (BatchNorm folding, padding, layout) then Inductor;
* ``inductor bf16``: ``torch.compile`` of a bf16 copy of the model (float inputs cast);
* ``graphopt bf16``: ``options={"precision": "bf16", "quantize": "none"}``: graphopt applies bf16
  where the CPU computes it natively, with fp32 islands, else keeps fp32 and says why;
* ``graphopt int8``: ``options={"quantize": "int8"}``: graphopt's guarded dynamic INT8 Linear
  layers, then Inductor.

Ratios are inductor time / graphopt time (> 1: graphopt faster): ``graphopt fp32`` against
``inductor fp32`` (done-when: >= 1.0 on the zoo: no slower), each lossy graphopt option against
``inductor fp32``, and ``graphopt bf16`` also against ``inductor bf16``. Each option's error
against eager is printed with the tolerance it is checked at (fp32: the deploy check's 1e-4 of
scale; graphopt's options: the tolerance their plan states).

Timing: ``peers_common``'s interleaved rounds (the order rotated every round, best-of a time
budget per option per round, garbage collector off while timing); ratios of the best rounds, the
median of the paired per-round ratios in brackets. The machine (CPU, ISA flags, threads,
versions) heads the output, the load average each model's. Dynamo's recompile count is checked
after timing: a timed call that recompiled would be flagged.

Run: ``python benchmarks/bench_compile_backend.py [--models bert,gpt2,llama,vit,convnext,resnet]
[--rounds 5] [--threads T] [--quick] [--no-bf16]`` (``--quick``: 2 rounds of 0.2 s, a smoke
run). Compiling dominates: minutes per model on 2 cores, more for the bf16 options on a CPU
without native bf16.
"""

from __future__ import annotations

import copy
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_host_peers import MODELS, build  # noqa: E402 - this folder is the script's
from peers_common import (  # noqa: E402
    Option,
    bench_args,
    budget,
    compare,
    first_line,
    fmt,
    interleaved,
    print_notes,
    quiet_and_say_how,
    ratio,
    within,
)

import graphopt  # noqa: E402

#: graphopt's options -> their torch.compile options
GRAPHOPT = {"graphopt fp32": {"precision": "fp32", "quantize": "none"},
            "graphopt bf16": {"precision": "bf16", "quantize": "none"},
            "graphopt int8": {"quantize": "int8"}}
#: (graphopt option, the inductor option it is compared with)
PAIRS = (("graphopt fp32", "inductor fp32"), ("graphopt bf16", "inductor fp32"),
         ("graphopt bf16", "inductor bf16"), ("graphopt int8", "inductor fp32"))


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _checked(ref: Any, out: Any, tol: tuple[float, float]) -> tuple[bool, str]:
    err = compare(ref, _first(out))
    ok = within(err, *tol)
    return ok, (f"err {err[0]:.3g} cos {err[1]:.6f} (tolerance {tol[0]:g} / {tol[1]:g}"
                f"{'' if ok else ': OUT'})")


def compiled(name: str, model: nn.Module, inputs: tuple[Any, ...], ref: Any,
             options: dict[str, Any] | None = None) -> Option:
    """``model`` compiled by Inductor (``options`` None) or graphopt, by its first call."""
    try:
        fn = (torch.compile(model) if options is None else
              torch.compile(model, backend="graphopt", options=options))
        start = time.perf_counter()
        with torch.inference_mode():
            out = fn(*inputs)
        seconds = time.perf_counter() - start
    except Exception as e:  # a compile failure: the column stays empty
        return Option(name, None, f"failed: {first_line(e)}", peer=False)
    tol = budget("bf16" if "bf16" in name and options is None else "fp32")
    what = ""
    if options is not None:
        plans = graphopt.last_plan()
        done = [g for g in plans if g.plan is not None]
        if done and done[0].plan.optimization is not None:
            stated = done[0].plan.optimization.tolerance
            tol = max(tol, (float(stated.rel_to_scale), float(stated.min_cosine)))
        passes = sorted({p for g in done for p in g.plan.optimization.passes_applied})
        what = (f"; {len(plans)} graph(s), runtimes "
                f"{','.join(sorted({g.runtime for g in plans}))}, passes "
                f"{','.join(passes) or 'none'}"
                + "".join(f"; fallback: {g.fallback}" for g in plans if g.fallback)
                + "".join(f"; {g.note}" for g in plans if g.note))
    ok, note = _checked(ref, out, tol)
    return Option(name, lambda: fn(*inputs), f"compile {seconds:.1f} s; {note}{what}", peer=ok)


def bf16_inductor(model: nn.Module, inputs: tuple[torch.Tensor, ...], ref: Any) -> Option:
    try:
        m16 = copy.deepcopy(model).to(torch.bfloat16)
    except Exception as e:
        return Option("inductor bf16", None, f"failed: {first_line(e)}", peer=False)
    x16 = tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs)
    return compiled("inductor bf16", m16, x16, ref)


def bench_model(name: str, args: Any, budget_s: float) -> list[tuple[str, str, Any]]:
    model, inputs, what = build(name)
    print(f"## {name}: {what} (load average {os.getloadavg()[0]:.1f})", flush=True)
    with torch.inference_mode():
        ref = model(*inputs).float().numpy()
    options = [compiled("inductor fp32", model, inputs, ref)]
    if not args.no_bf16:
        options.append(bf16_inductor(model, inputs, ref))
    for label, opts in GRAPHOPT.items():
        if args.no_bf16 and "bf16" in label:
            continue
        options.append(compiled(label, model, inputs, ref, opts))
    print_notes(options)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    interleaved(options, args.rounds, budget_s)
    if torch._dynamo.utils.counters["stats"]["unique_graphs"] != graphs:
        print("  WARNING: dynamo recompiled during timing; these numbers include compiles")
    by = {o.name: o for o in options}
    print("\n| option | best ms | rounds ms |\n|---|---:|---|")
    for o in options:
        print(f"| {o.name} | {min(o.times) * 1e3:.1f} | "
              f"{' '.join(f'{t * 1e3:.1f}' for t in o.times)} |" if o.times else
              f"| {o.name} (not run) | - | - |")
    rows = []
    for go, ind in PAIRS:
        g, i = by.get(go), by.get(ind)
        r = ratio(i.times, g.times) if g is not None and i is not None and g.times and \
            i.times else None
        rows.append((go, ind, r))
        if g is not None and i is not None:
            print(f"  {ind} / {go}: {fmt(r)}")
    print(flush=True)
    return rows


def main() -> None:
    args, names, budget_s = bench_args(__doc__, MODELS, lambda ap: ap.add_argument(
        "--no-bf16", action="store_true", help="leave out the bf16 options"))
    torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = 64  # five compiled variants of each model's code
    quiet_and_say_how(args, budget_s)
    print("ratios: inductor time / graphopt time (> 1: graphopt faster); the machine is "
          "whatever else runs on it too: compare ratios, not milliseconds\n", flush=True)
    table = []
    for m in names:
        table.append((m, bench_model(m, args, budget_s)))
        torch._dynamo.reset()
        gc.collect()
    print("## summary: inductor / graphopt (> 1: graphopt faster)\n")
    print("| model | " + " | ".join(f"{i} / {g}" for g, i in PAIRS) + " |\n|---|"
          + "---:|" * len(PAIRS))
    slower = []
    for m, rows in table:
        print(f"| {m} | " + " | ".join(fmt(r) for _, _, r in rows) + " |")
        fp32 = rows[0][2]
        if fp32 is not None and fp32[0] < 1.0:
            slower.append(m)
    print(f"\ndone-when (graphopt fp32 no slower than inductor fp32): "
          f"{'slower on ' + ', '.join(slower) if slower else 'met'} ({len(table)} models)")


if __name__ == "__main__":
    main()
