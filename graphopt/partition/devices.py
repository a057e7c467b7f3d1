"""Devices a model can be split across: a target profile, usable memory, and the links between.

``--devices cuda:0=h100,cuda:1=a100:40GB,cpu:8GB`` declares them: ``NAME[=TARGET][:CAP]`` where
TARGET is a `graphopt targets` name (default: the host CPU for ``cpu*`` names) and CAP an
optional memory cap (``40GB``, ``512MiB``). Links come from the profiles (NVLink between two
GPUs that both have it, else PCIe through the host): see :func:`graphopt.cost.link_between`.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile, Link

__all__ = ["MAX_DEVICES", "Device", "DeviceSet", "check_device_count"]

#: the most devices a split takes: the schedulers' search grows with the square of the device
#: count (HEFT tries every node on every device, then moves between each pair), and 128 (16
#: machines of 8 GPUs) plans a small model in about 2 s, 256 in 4-7 s, 1000 in minutes
MAX_DEVICES = 128


def check_device_count(n: int) -> None:
    """Refuse more than MAX_DEVICES devices before any work proportional to their pairs."""
    if n > MAX_DEVICES:
        raise GraphoptError(
            f"{n} devices given; graphopt splits a model across at most {MAX_DEVICES}",
            f"give at most {MAX_DEVICES} devices; for a larger cluster, plan the devices of one "
            "model replica (e.g. 2 machines of 8 GPUs: cuda:0=h100@a,...,net=400Gb/s)")


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

    def __post_init__(self) -> None:
        check_device_count(len(self.devices))

    def link(self, a: str, b: str) -> Link:
        return self.links[(a, b)]

    def transfer_time_s(self, nbytes: float, a: str, b: str) -> float:
        """Seconds to move ``nbytes`` from device ``a`` to ``b`` (0 on the same device)."""
        return 0.0 if a == b else self.links[(a, b)].transfer_time_s(nbytes)
