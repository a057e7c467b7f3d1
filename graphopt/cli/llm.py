"""``graphopt llm file.py:build``: the CLI face of :func:`graphopt.api.llm.plan_llm`."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from graphopt.api.llm import plan_llm
from graphopt.cli.args import add_no_calibrate, cli_target
from graphopt.errors import GraphoptError
from graphopt.files.inputs import input_files
from graphopt.files.outputs import OutputSet
from graphopt.frontends.python_spec import is_python_spec, load_python_spec
from graphopt.hardware.registry import DEFAULT_TARGET
from graphopt.report.format import fmt_bytes, fmt_seconds

__all__ = ["add_parser"]


def _cmd_llm(args: argparse.Namespace) -> int:
    if not is_python_spec(args.model):
        raise GraphoptError(f"graphopt llm takes file.py:function, got {args.model!r}",
                            "write a function that returns (model, example_inputs) for a "
                            "transformers Llama-layout causal LM (inputs are not used)")
    outputs = OutputSet(input_files(args.model))
    outputs.claim_each((args.json, args.md, args.html), "report")  # before the work
    model = load_python_spec(args.model)[0]
    low, _, high = args.batch.partition(":")
    try:
        batch = (int(low), int(high)) if high else int(low)
    except ValueError:
        raise GraphoptError(f"--batch {args.batch!r} is not MAX or MIN:MAX",
                            "write e.g. --batch 1:64") from None
    lp = plan_llm(model, cli_target(args), batch=batch, prompt_len=args.prompt,
                  cache_len=args.cache, quantize=args.quantize)
    lp.decode.stage_reports(outputs, json=args.json, md=args.md, html=args.html)
    written = outputs.commit()
    llm = lp.section
    mem = llm.memory
    print(f"{lp.decode.model.name} on {lp.decode.target.display_name}: KV cache "
          f"{fmt_bytes(mem.kv_bytes_per_sequence)} per sequence of {args.cache} "
          f"tokens; largest batch that fits: {mem.max_batch_size}; recommended decode "
          f"batch {mem.recommended_batch_size} ({mem.batch_decided_by})")
    if llm.quantize != "none":
        gemms = llm.weight_formats.decode.gemm_formats
        print(f"  quantize {llm.quantize}: decode weight GEMMs "
              + ", ".join(f"{k} x{v}" for k, v in sorted(gemms.items()))
              + f"; weights {fmt_bytes(mem.weight_bytes)}")
    print("  decode  batch  tokens/s  bound tokens/s | prefill tokens/s  TTFT")
    for d, p in zip(llm.decode, llm.prefill, strict=False):
        print(f"          {d.batch:5d}  {d.tokens_per_s:8.0f}  "
              f"{d.bound_tokens_per_s:14.0f} | {p.tokens_per_s:16.0f}  "
              f"{fmt_seconds(p.step_s)}")
    for path in written:
        print(f"wrote {path}")
    return 0


def add_parser(sub: argparse._SubParsersAction,
               add_reports: Callable[[argparse.ArgumentParser], None]) -> None:
    pm = sub.add_parser("llm", help="plan a decoder LLM's prefill and decode over a batch "
                                     "range: tokens/s, the bandwidth bound, the KV cache")
    pm.add_argument("model", help="file.py:function returning (model, inputs) for a "
                                  "transformers Llama-layout causal LM (meta device is fine)")
    pm.add_argument("--target", default=DEFAULT_TARGET, help="target name (see `graphopt targets`)")
    add_no_calibrate(pm)
    pm.add_argument("--batch", default="1:64", metavar="MIN:MAX",
                    help="the batch range (default 1:64)")
    pm.add_argument("--prompt", type=int, default=512, help="prefill prompt length")
    pm.add_argument("--cache", type=int, default=2048, help="decode KV-cache length")
    pm.add_argument("--quantize", default="none", metavar="FORMAT",
                    help="the weight GEMMs' format: none (the weights' dtype, default), auto "
                         "(each GEMM's precision decision), fp8, int8 or int4; the first and "
                         "last weight GEMM stay at the weights' dtype on GPUs")
    add_reports(pm)
    pm.set_defaults(func=_cmd_llm)
