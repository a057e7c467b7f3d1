"""Devices a model can be split across: a target profile, usable memory, and the links between.

``--devices cuda:0=h100,cuda:1=a100:40GB,cpu:8GB`` declares them: ``NAME[=TARGET][:CAP]`` where
TARGET is a `graphopt targets` name (default: the host CPU for ``cpu*`` names) and CAP an
optional memory cap (``40GB``, ``512MiB``). Links come from the profiles (NVLink between two
GPUs that both have it, else PCIe through the host): see :func:`graphopt.cost.link_between`.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.hardware.profile import HardwareProfile, Link

__all__ = ["Device", "DeviceSet"]


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a split: its name (``cuda:0``), profile and the memory usable for the
    model (the profile's memory less the reserve policy, or the user's cap)."""

    name: str
    profile: HardwareProfile
    memory_bytes: int

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "target": self.profile.name,
                "memory_bytes": self.memory_bytes}


@dataclass(frozen=True, slots=True)
class DeviceSet:
    """The devices in a fixed order and the link between each ordered pair."""

    devices: tuple[Device, ...]
    links: dict[tuple[str, str], Link]

    def link(self, a: str, b: str) -> Link:
        return self.links[(a, b)]

    def transfer_time_s(self, nbytes: float, a: str, b: str) -> float:
        """Seconds to move ``nbytes`` from device ``a`` to ``b`` (0 on the same device)."""
        return 0.0 if a == b else self.links[(a, b)].transfer_time_s(nbytes)
