"""Cost of moving a tensor between two devices (or a device and the host)."""

from __future__ import annotations

from graphopt.hardware.profile import HardwareProfile, Link

__all__ = ["link_between", "transfer_time_s"]


def link_between(a: HardwareProfile, b: HardwareProfile) -> Link:
    """The path data takes from a device of profile ``a`` to another device of profile ``b``
    (two distinct devices, even when they share a profile: two H100s talk over NVLink).

    Two GPUs that both have a peer link (NVLink) use the slower of the two; otherwise data goes
    through the host over each side's PCIe link, so bandwidth is the slower link's and the
    latencies add. A CPU is the host: only the GPU's link is crossed.
    """
    if a.peer_link is not None and b.peer_link is not None:
        fast = min((a.peer_link, b.peer_link), key=lambda link: link.bandwidth_bytes_per_s)
        return Link(fast.name, fast.bandwidth_bytes_per_s,
                    max(a.peer_link.latency_s, b.peer_link.latency_s))
    hops = [p.host_link for p in (a, b) if p.is_gpu]
    if not hops:
        return Link("host-memory", min(a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s), 0.0)
    slow = min(hops, key=lambda link: link.bandwidth_bytes_per_s)
    return Link("+".join(h.name for h in hops), slow.bandwidth_bytes_per_s,
                sum(h.latency_s for h in hops))


def transfer_time_s(nbytes: float, a: HardwareProfile, b: HardwareProfile) -> float:
    """Seconds to move ``nbytes`` from ``a`` to ``b`` (latency + size / bandwidth); the same
    profile object on both sides means the same device: nothing moves."""
    if a is b:
        return 0.0
    return link_between(a, b).transfer_time_s(nbytes)
