"""Run a function in several local processes over torch.distributed's gloo backend (CPU).

The tensor-parallel tests spawn their ranks with :func:`spawn`; each rank's worker calls
:func:`init_gloo` first and writes what it saw under ``out_dir`` for the test to read.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch

__all__ = ["every_rank_equals", "free_port", "gloo_mesh", "init_gloo", "needs_gloo",
           "save_rank", "spawn", "state_unchanged"]

needs_gloo = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with the gloo backend is not available in this torch build")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_gloo(rank: int, world: int, port: int) -> None:
    """Join the process group of ``world`` local ranks on loopback."""
    import torch.distributed as dist

    if sys.platform.startswith("linux"):  # the ranks are local processes: loopback only
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))


def _run_then_exit(rank: int, worker: Callable[[int, int, int, str], None], world: int,
                   port: int, out_dir: str) -> None:
    """Run one rank's worker, then leave without the interpreter's teardown.

    The worker has written its results and destroyed the process group by then. What is
    left is finalization, where gloo's C++ threads can still be joinable and abort the
    process ("terminate called without an active exception", seen once in CI; torch
    discusses it in pytorch/pytorch#179291). A worker that raises still fails the test.
    """
    worker(rank, world, port, out_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(worker: Callable[[int, int, int, str], None], world: int, out_dir: Path, what: str,
          timeout_s: float = 90.0) -> None:
    """Run ``worker(rank, world, port, out_dir)`` in ``world`` processes; fail the test if
    they do not finish in ``timeout_s``."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_run_then_exit, args=(worker, world, free_port(), str(out_dir)),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"{what} did not finish in {timeout_s:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)


def state_unchanged(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> bool:
    """The user's model still holds plain tensors equal to ``before`` (its state_dict copy)."""
    return all(type(v) is torch.Tensor and torch.equal(v, before[k])
               for k, v in model.state_dict().items())


def save_rank(out_dir: str, rank: int, logits: torch.Tensor, facts: dict[str, object]) -> None:
    """One rank's output and what it saw, for the test process to read."""
    torch.save(logits, Path(out_dir) / f"logits_{rank}.pt")
    (Path(out_dir) / f"facts_{rank}.json").write_text(json.dumps(facts))


def _rank_results(out_dir: Path, world: int) -> list[tuple[torch.Tensor, dict[str, object]]]:
    """Each rank's (logits, facts) as :func:`save_rank` wrote them."""
    return [(torch.load(out_dir / f"logits_{r}.pt", weights_only=True),
             json.loads((out_dir / f"facts_{r}.json").read_text())) for r in range(world)]


def every_rank_equals(out_dir: Path, world: int, want: torch.Tensor,
                      facts: dict[str, object]) -> None:
    """Each rank's logits equal ``want`` (the single-process model's) and it saw ``facts``."""
    for got, seen in _rank_results(out_dir, world):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert seen == facts


@contextlib.contextmanager
def gloo_mesh(rank: int, world: int, port: int) -> Iterator[object]:
    """A rank's 1-D CPU device mesh over gloo; waits for every rank, then leaves the group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    init_gloo(rank, world, port)
    try:
        yield init_device_mesh("cpu", (world,))
        dist.barrier()
    finally:
        dist.destroy_process_group()
