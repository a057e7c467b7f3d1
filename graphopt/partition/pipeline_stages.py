"""Pipeline stages of a partition for ``torch.distributed.pipelining``.

graphopt decides the stages (node lists of a "pipeline" :class:`Partition`); PyTorch's engine
runs them. Each stage is cut from the exported fx graph with
:func:`graphopt.partition.emit.cut_graph` and wrapped in ``PipelineStage`` with static input
and output metadata taken from export's FakeTensors, so no shape inference round trip is
needed. ``torch.distributed.pipelining.pipeline()`` is not used: it splits at module FQNs or
``pipe_split()`` markers in ``forward``, while graphopt's stages are sets of fx nodes that
need not follow module boundaries.

Why stages pass values through: a ``PipelineStage`` only receives from the stage before it,
so a value made in stage 0 and read in stage 2 (a skip connection over a stage boundary) is
an output of stage 0 and an input and output of stage 1. The first stage takes all model
inputs; the last returns the model's flat outputs, which :meth:`PipelineStages.unflatten`
puts back into the model's output structure.

Shapes are static: the stages are exported at the microbatch shape (batch / n_microbatches),
so the batch must divide evenly.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from graphopt.errors import GraphoptError
from graphopt.partition.emit import (
    CutPart,
    cut_graph,
    export_graph_module,
    node_devices,
    resolve_device,
)
from graphopt.partition.result import Partition

__all__ = ["PipelineStages", "build_pipeline_stages", "microbatch", "run_local_pipeline",
           "run_pipeline_worker"]

logger = logging.getLogger(__name__)


def microbatch(example_inputs: Any, n_microbatches: int) -> tuple[torch.Tensor, ...]:
    """The first microbatch of ``example_inputs`` (split along dim 0, as ``ScheduleGPipe``
    splits them); raises unless every input's batch divides evenly."""
    if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) \
            or n_microbatches < 1:
        raise GraphoptError(f"n_microbatches={n_microbatches!r}: a pipeline needs at least one "
                            "microbatch", "pass a positive integer that divides the batch")
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(args, (tuple, list)) or not all(isinstance(a, torch.Tensor)
                                                       for a in args):
        raise GraphoptError("pipeline stages need positional tensor inputs",
                            "pass example_inputs as a tensor or a tuple of tensors")
    for a in args:
        if a.dim() == 0 or a.shape[0] % n_microbatches:
            raise GraphoptError(f"batch of shape {tuple(a.shape)} does not split into "
                                f"{n_microbatches} equal microbatches along dim 0",
                                "use a batch size that is a multiple of n_microbatches")
    return tuple(a.tensor_split(n_microbatches)[0] for a in args)


def _meta(node: fx.Node) -> torch.Tensor:
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor):
        raise GraphoptError(f"pipeline boundary value {node.name} is not a tensor "
                            f"({type(v).__name__})",
                            "move the stage boundary so that only tensors cross it")
    return torch.empty(v.shape, dtype=v.dtype, device="meta")


@dataclass
class PipelineStages:
    """The stage modules of one pipeline and what ``PipelineStage`` needs to wrap them."""

    parts: list[CutPart]
    devices: tuple[str, ...]
    input_meta: tuple[tuple[torch.Tensor, ...], ...]
    output_meta: tuple[tuple[torch.Tensor, ...], ...]
    out_spec: Any
    n_microbatches: int

    @property
    def num_stages(self) -> int:
        return len(self.parts)

    def module(self, index: int) -> fx.GraphModule:
        m = self.parts[index].module
        if m is None:
            raise GraphoptError(f"stage {index} was not built", "build it with only=None")
        return m

    def stage(self, index: int, device: torch.device | str = "cpu",
              group: Any = None) -> Any:
        """``PipelineStage`` for stage ``index`` on ``device`` (this rank's stage)."""
        from torch.distributed.pipelining import PipelineStage

        dev = torch.device(device)
        return PipelineStage(self.module(index).to(dev), index, self.num_stages, dev,
                             input_args=self.input_meta[index],
                             output_args=self.output_meta[index], group=group)

    def unflatten(self, flat: Any) -> Any:
        """The last stage's merged output in the model's output structure."""
        leaves = list(flat) if isinstance(flat, (tuple, list)) else [flat]
        return pytree.tree_unflatten(leaves, self.out_spec)


def build_pipeline_stages(model: nn.Module, example_inputs: Any,
                          stages: Partition | Sequence[Sequence[str]], n_microbatches: int,
                          *, device_map: Mapping[str, torch.device | str] | None = None,
                          only: int | None = None) -> PipelineStages:
    """Cut ``model`` into pipeline stages at the microbatch shape.

    ``stages`` is a "pipeline" :class:`Partition` or the node names of each stage. With
    ``only`` just that stage's module is built (a rank needs only its own parameters).
    """
    if isinstance(stages, Partition):
        if not stages.stages:
            raise GraphoptError(f"a {stages.strategy!r} partition has no pipeline stages",
                                "split with strategy='pipeline'")
        names, devices = stages.stages, stages.stage_devices
    else:
        names, devices = tuple(tuple(s) for s in stages), ("cpu",) * len(stages)
    gm = export_graph_module(model, microbatch(example_inputs, n_microbatches))
    label = {n: str(i) for i, stage in enumerate(names) for n in stage}
    dev = node_devices(gm, label, "0")
    groups: list[tuple[str, list[fx.Node]]] = [(d, []) for d in devices]
    for node, stage_label in dev.items():  # graph order: a valid order within each stage
        groups[int(stage_label)][1].append(node)
    for node, stage_label in dev.items():
        late = [a.name for a in node.all_input_nodes if int(dev.get(a, 0)) > int(stage_label)]
        if late:
            raise GraphoptError(f"stage {stage_label} node {node.name} reads {late[0]} of a "
                                "later stage", "pipeline stages must follow execution order")

    def device_of(name: str) -> torch.device:
        return resolve_device(name, device_map)

    parts = cut_graph(gm, groups, device_of, carry=True,
                      build=lambda i: only is None or i == only)
    by_name = {n.name: n for n in gm.graph.nodes}
    out_spec = gm._out_spec  # noqa: SLF001 - export's output pytree
    logger.info("built %d pipeline stages of %s", len(parts), type(model).__name__)
    return PipelineStages(
        parts=parts, devices=tuple(devices),
        input_meta=tuple(tuple(_meta(by_name[v]) for v in p.info.inputs) for p in parts),
        output_meta=tuple(tuple(_meta(by_name[v]) for v in p.info.outputs) for p in parts),
        out_spec=out_spec, n_microbatches=n_microbatches)


def run_pipeline_worker(rank: int, world_size: int, model_factory: Callable[[], nn.Module],
                        example_inputs: Any, stages: Sequence[Sequence[str]],
                        n_microbatches: int, result_path: str | None = None, *,
                        init_method: str = "env://", backend: str = "gloo",
                        device: str | None = None, timeout_s: float = 60.0) -> Any:
    """One rank of a GPipe run: rank ``r`` runs stage ``r``; rank 0 feeds ``example_inputs``
    (the whole batch) and the last rank returns, and saves to ``result_path``, the output.

    ``torchrun`` style: the default ``env://`` reads MASTER_ADDR/MASTER_PORT. ``device``
    defaults to ``cpu`` (``cuda:<local rank>`` suits the nccl backend).
    """
    import torch.distributed as dist
    from torch.distributed.pipelining import ScheduleGPipe

    if len(stages) != world_size:
        raise GraphoptError(f"{len(stages)} stages for {world_size} ranks",
                            "run one rank per pipeline stage")
    dist.init_process_group(backend, init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))
    try:
        built = build_pipeline_stages(model_factory(), example_inputs, stages, n_microbatches,
                                      only=rank)
        stage = built.stage(rank, device or "cpu")
        schedule = ScheduleGPipe(stage, n_microbatches=n_microbatches)
        args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) \
            else tuple(example_inputs)
        with torch.no_grad():
            out = schedule.eval(*args) if rank == 0 else schedule.eval()
        result = built.unflatten(out) if stage.is_last else None
        if result is not None and result_path:
            torch.save(result, result_path)
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_entry(rank: int, world_size: int, port: int, *rest: Any) -> None:
    if sys.platform.startswith("linux"):  # loopback: the ranks are local processes
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    run_pipeline_worker(rank, world_size, *rest, init_method=f"tcp://127.0.0.1:{port}")


def run_local_pipeline(model_factory: Callable[[], nn.Module], example_inputs: Any,
                       stages: Sequence[Sequence[str]], n_microbatches: int, *,
                       timeout_s: float = 90.0) -> Any:
    """Run the stages in one local process each (gloo, CPU) and return the model's output.

    ``model_factory`` must be picklable (a module-level function) and build the same weights
    in every process. Processes still running at ``timeout_s`` are killed and an error raised.
    """
    import torch.multiprocessing as mp

    world = len(stages)
    with tempfile.TemporaryDirectory(prefix="graphopt-pp-") as tmp:
        result = Path(tmp) / "out.pt"
        ctx = mp.start_processes(
            _worker_entry, args=(world, _free_port(), model_factory, example_inputs,
                                 [list(s) for s in stages], n_microbatches, str(result)),
            nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise GraphoptError(f"pipeline run did not finish in {timeout_s:.0f} s",
                                        "check that the ranks can reach each other")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        return torch.load(result, weights_only=True)
