"""Collective communication on the declared links: the ring all-reduce of tensor parallelism.

Ring all-reduce of ``B`` bytes over ``t`` devices (Patarasuk & Yuan 2009; NCCL's ring):
a reduce-scatter then an all-gather, each ``t - 1`` steps moving ``B / t`` bytes per device, so

    time = 2 (t - 1) / t * B / bandwidth + 2 (t - 1) * latency

A reduce-scatter or an all-gather alone is one of the two halves:
``(t - 1) / t * B / bandwidth + (t - 1) * latency`` (``B`` the full tensor). Megatron's sequence
parallelism replaces each all-reduce by one of each, at the same total.

Bandwidth and latency are those of the slowest link the ring crosses. Every link in the
group is taken as a candidate (a ring may be laid in any device order, and the worst pair bounds
the step time), so the group's slowest link is used: conservative for a mixed group, exact for
a uniform NVLink or PCIe one.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphopt.hardware.profile import Link
from graphopt.partition.devices import DeviceSet

__all__ = ["group_link", "ring_allreduce_s", "ring_half_s", "slowest_link"]


def ring_allreduce_s(nbytes: float, degree: int, link: Link) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``degree`` devices on ``link``."""
    if degree <= 1 or nbytes <= 0:
        return 0.0
    steps = 2 * (degree - 1)
    return steps / degree * nbytes / link.bandwidth_bytes_per_s + steps * link.latency_s


def ring_half_s(nbytes: float, degree: int, link: Link) -> float:
    """Seconds for a ring reduce-scatter (or all-gather) of a ``nbytes`` tensor."""
    if degree <= 1 or nbytes <= 0:
        return 0.0
    return (degree - 1) / degree * nbytes / link.bandwidth_bytes_per_s \
        + (degree - 1) * link.latency_s


def group_link(devices: DeviceSet, names: Sequence[str] | None = None) -> Link | None:
    """The slowest link between any two devices of the group (lowest bandwidth, and the highest
    latency of any pair): what bounds a ring step. None for a group of one."""
    names = [d.name for d in devices.devices] if names is None else list(names)
    links = [devices.link(a, b) for a in names for b in names if a != b]
    return slowest_link(links) if links else None


def slowest_link(links: Sequence[Link]) -> Link:
    """One link as slow as the slowest of ``links``: the lowest bandwidth and the highest
    latency among them (a transfer over any of them is bounded by both)."""
    slow = min(links, key=lambda link: link.bandwidth_bytes_per_s)
    return Link(slow.name, slow.bandwidth_bytes_per_s, max(lk.latency_s for lk in links))
