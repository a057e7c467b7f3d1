"""ONNX Runtime sessions with the large weights handed over in memory (``files/ort_load``)
against sessions of the whole serialized model: how long each takes to build, and whether the
built sessions run as fast.

For each model (``bench_host_peers.build``), graphopt's optimized ONNX model
(``optimize(target="cpu", measure=False).ensure_onnx()``) is loaded both ways, alternated, for
``--builds`` rounds (the build time includes serializing). Then both sessions run interleaved,
order alternated, best of 3 calls per round, for ``--rounds`` rounds; the speed ratio is the
median of the paired per-round ratios (whole-serialized time over in-memory time: above 1, the
in-memory session is faster). Outputs are compared (they must be equal).

Run: ``python benchmarks/bench_ort_load.py [--models gpt2,vit,resnet] [--rounds 16]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_host_peers import build  # noqa: E402
from peers_common import best_of, machine  # noqa: E402

import graphopt  # noqa: E402
from graphopt.files.ort_load import in_memory_session  # noqa: E402


def options(threads: int) -> ort.SessionOptions:
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    return o


def one_model(name: str, builds: int, rounds: int, threads: int) -> None:
    model, inputs, what = build(name)
    proto = graphopt.optimize(model, inputs, target="cpu", measure=False).ensure_onnx()
    feeds = {i.name: x.numpy() for i, x in zip(proto.graph.input, inputs, strict=False)}
    ways = {"whole": lambda: ort.InferenceSession(proto.SerializeToString(), options(threads),
                                                  providers=["CPUExecutionProvider"]),
            "in memory": lambda: in_memory_session(proto, options(threads),
                                                   ["CPUExecutionProvider"])}
    built: dict[str, list[float]] = {w: [] for w in ways}
    sessions = {}
    for r in range(builds):
        for way in list(ways)[:: 1 if r % 2 == 0 else -1]:
            start = time.perf_counter()
            sessions[way] = ways[way]()
            built[way].append(time.perf_counter() - start)
    outs = {w: s.run(None, feeds) for w, s in sessions.items()}
    same = all(np.array_equal(a, b) for a, b in zip(outs["whole"], outs["in memory"],
                                                    strict=True))
    ran: dict[str, list[float]] = {w: [] for w in ways}
    for r in range(rounds):
        for way in list(ways)[:: 1 if r % 2 == 0 else -1]:
            ran[way].append(best_of(lambda s=sessions[way]: s.run(None, feeds), 0.0))
    speed = statistics.median(a / b for a, b in zip(ran["whole"], ran["in memory"],
                                                    strict=True))
    print(f"{name:8s} {what}: {proto.ByteSize() / 1e6:.0f} MB")
    print(f"    build: whole {min(built['whole']):.2f}-{max(built['whole']):.2f} s, in memory "
          f"{min(built['in memory']):.2f}-{max(built['in memory']):.2f} s ({builds} each)")
    print(f"    run: whole best {min(ran['whole']) * 1e3:.1f} ms, in memory best "
          f"{min(ran['in memory']) * 1e3:.1f} ms; whole / in memory {speed:.3f} (median of "
          f"{rounds} paired rounds); equal outputs: {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,vit,resnet")
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    print(f"machine: {machine(args.threads)}")
    for name in args.models.split(","):
        one_model(name, args.builds, args.rounds, args.threads)


if __name__ == "__main__":
    main()
