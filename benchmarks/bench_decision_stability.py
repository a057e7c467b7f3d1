"""Do measured decisions hold? ``optimize(target="cpu")`` run ten times per model on this machine,
with background load, and how often the choice (the passes applied, the artifact to deploy)
repeats (issue 33: the same command flipped its INT8 and deploy choices between runs on a busy
machine).

Models (generated here, nothing downloaded): an ONNX CNN classifier, an ONNX LSTM (torch's
``nn.LSTM`` exported), and a torch CNN. Load: ``--busy N`` processes spinning on the CPU
(default: the CPU count plus one, "more busy processes than cores").

Prints, per model, the choice each run made and the share of runs that made the most common
one; the issue's floor is 9 of 10.

Run: ``python benchmarks/bench_decision_stability.py [--runs 10] [--busy N]``.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import graphopt


def _spin(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        x = (x * 1103515245 + 12345) % 2**31


class Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 256),
                                  nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Lstm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rnn, self.head = nn.LSTM(64, 128, batch_first=True), nn.Linear(128, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


def _models(folder: Path) -> dict[str, tuple[Any, Any]]:
    cnn_x = torch.randn(4, 3, 32, 32)
    lstm_x = torch.randn(2, 24, 64)
    paths = {}
    for name, model, x in (("onnx-cnn", Cnn(), cnn_x), ("onnx-lstm", Lstm(), lstm_x)):
        paths[name] = folder / f"{name}.onnx"
        torch.onnx.export(model.eval(), (x,), paths[name], dynamo=False, input_names=["x"])
    return {"onnx-cnn": (paths["onnx-cnn"], None), "onnx-lstm": (paths["onnx-lstm"], None),
            "torch-cnn": (Cnn().eval(), (cnn_x,))}


def _choice(model: Any, inputs: Any) -> str:
    opt = graphopt.optimize(model, inputs, target="cpu", measure=True)
    passes = ",".join(opt.plan.optimization.passes_applied) or "none"
    return f"passes={passes} deploy={opt.deploy.artifact}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--busy", type=int, default=(os.cpu_count() or 1) + 1)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, {args.busy} busy processes")
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
            for _ in range(args.busy)]
    with tempfile.TemporaryDirectory() as tmp:
        models = _models(Path(tmp))
        for p in busy:
            p.start()
        try:
            for name, (model, inputs) in models.items():
                start = time.perf_counter()
                seen = [_choice(model, inputs) for _ in range(args.runs)]
                top, count = collections.Counter(seen).most_common(1)[0]
                print(f"{name}: {count}/{args.runs} runs chose '{top}' "
                      f"({time.perf_counter() - start:.0f} s)")
                for other, n in collections.Counter(seen).items():
                    if other != top:
                        print(f"    {n}x '{other}'")
        finally:
            stop.set()
            for p in busy:
                p.join(timeout=5)


if __name__ == "__main__":
    main()
