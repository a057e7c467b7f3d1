"""Devices from the ``--devices`` flag or from this machine.

Grammar (comma-separated): ``NAME[=TARGET][:CAP]``.

1. ``cuda:0=h100`` -- a device named ``cuda:0`` with the h100 profile.
2. ``cuda:1=a100:40GB`` -- the same with a memory cap; CAP is a number with a unit
   (GB/MB/TB = 10^9/10^6/10^12 bytes, GiB/MiB/TiB = powers of 2; case-insensitive).
3. ``cpu`` / ``cpu:8GB`` / ``cpu:1`` -- a name starting with ``cpu`` and no TARGET is the host
   CPU profile; ``gpu``/``cuda:N`` alone is this machine's CUDA device; any other bare name
   (``h100``) is a target name used as both name and target. After a bare name's ``:`` only
   a device index or a CAP may follow (``cpu:abc`` is refused, not taken as a name).
4. A CAP must be a finite, positive size: ``0GB``, ``-5GB``, ``nanGB``, ``1e400GB`` are refused.
5. Several machines: ``NAME[=TARGET][:CAP]@HOST`` puts a device on machine HOST (devices
   without ``@`` share one unnamed machine), and one item ``net=BANDWIDTH`` gives the network
   between machines (``400Gb/s`` or ``400Gbps`` in bits, ``50GB/s`` in bytes; k/M/G/T). Two
   devices on different machines talk over that network (5 us per message, RDMA-class), not
   NVLink or PCIe: ``cuda:0=h100@a,...,cuda:3=h100@a,cuda:4=h100@b,...,net=400Gb/s`` is 2
   nodes x 4 H100s. Devices on two machines with no ``net=`` item are refused.
6. At most :data:`~graphopt.partition.devices.MAX_DEVICES` devices (128): the schedulers' work
   grows with the square of the count.

Usable memory = min(cap, total - reserve) with the reserve policy of
:func:`graphopt.decisions.memory_runtime.memory.usable_memory`; a cap above the device's total
memory is a mistake, not a wish, and is refused. Links come from :func:`graphopt.cost.link_between`
for each
ordered pair.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Sequence

from graphopt.cost.transfer import link_between
from graphopt.decisions.memory_runtime.memory import usable_memory
from graphopt.errors import GraphoptError
from graphopt.hardware import get_target, host_cpu_profile
from graphopt.hardware.detect import detect_gpus, gpu_profile_for
from graphopt.hardware.profile import HardwareProfile, Link
from graphopt.hardware.registry import memory_variant
from graphopt.partition.devices import Device, DeviceSet, check_device_count

__all__ = ["detect_devices", "make_device_set", "parse_bandwidth", "parse_devices", "parse_size"]

logger = logging.getLogger(__name__)

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
# a number (signs, exponents, nan and inf included, so that they are refused with a reason
# rather than read as part of a device name) and a unit
_SIZE = re.compile(r"^\s*([+-]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?|nan|inf(?:inity)?))"
                   r"\s*([a-z]+)\s*$", re.IGNORECASE)
_SIZE_FIX = "write a positive size with a unit, like 40GB, 40GiB, 512MiB or 1TB"
_EXAMPLE = "e.g. --devices cuda:0=h100,cuda:1=a100:40GB,cpu:8GB"
_BW = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(b|B)(?:it)?(?:/s|ps)\s*$",
                 re.IGNORECASE)
_BW_FIX = "write net=BANDWIDTH with a unit per second, like net=400Gb/s or net=50GB/s"
_NET_LATENCY_S = 5e-6  # one message between machines over RDMA (InfiniBand/RoCE class)


def parse_size(text: str) -> int:
    """``"40GB"`` -> 40_000_000_000 bytes; a missing or unknown unit, or a size that is not a
    finite positive number of bytes (``0GB``, ``-5GB``, ``nanGB``, ``1e400GB``), is an error."""
    m = _SIZE.match(text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise GraphoptError(f"memory cap {text!r} is not a size with a unit", _SIZE_FIX)
    size = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(size):
        raise GraphoptError(f"memory cap {text.strip()!r} is not a finite size", _SIZE_FIX)
    if size < 1:
        raise GraphoptError(f"memory cap {text.strip()!r} is not positive (under one byte)",
                            _SIZE_FIX)
    return int(size)


def _looks_like_size(text: str) -> bool:
    return _SIZE.match(text) is not None


def _split_item(item: str) -> tuple[str, str | None, str | None]:
    """``NAME[=TARGET][:CAP]`` -> (name, target or None, cap text or None)."""
    if "=" in item:
        name, _, rest = item.partition("=")
        target, cap = rest, None
        head, sep, tail = rest.rpartition(":")
        if sep and _looks_like_size(tail):
            target, cap = head, tail
        elif sep and not (tail.strip().isdigit() and head.strip().lower() in ("cuda", "gpu")):
            # (cuda:0=cuda:1 names this machine's second GPU)
            unit = " has no unit" if tail.strip().isdigit() else " is not a memory cap"
            raise GraphoptError(f"device {item!r}: {tail!r} after ':'{unit}",
                                f"write NAME=TARGET:CAP with a unit, {_EXAMPLE}")
        return name.strip(), target.strip(), cap
    head, sep, tail = item.rpartition(":")
    if sep and _looks_like_size(tail):
        return head.strip(), None, tail
    if sep and not tail.strip().isdigit():  # cpu:abc, cpu:1e400 -- not a name with the host
        raise GraphoptError(f"device {item.strip()!r}: {tail.strip()!r} after ':' is neither a "
                            "device index nor a memory cap",
                            f"write NAME:INDEX (cpu:1) or NAME:CAP with a unit, {_EXAMPLE}")
    return item.strip(), None, None


def _profile_for(name: str, target: str | None, cap: int | None = None) -> HardwareProfile:
    named = target or name
    if not target and (name.lower().startswith("cpu") or name.lower() == "host"):
        return host_cpu_profile()
    # a100:40GB is the A100 40GB where the table has it, not the 80 GB card capped
    return (cap is not None and memory_variant(named, cap)) or get_target(named)


def _device(name: str, profile: HardwareProfile, cap: int | None) -> Device:
    usable = usable_memory(profile)
    if cap is not None:
        if cap > profile.memory_bytes:
            raise GraphoptError(
                f"device {name}: cap {cap / 2**30:.1f} GiB is larger than its "
                f"{profile.memory_bytes / 2**30:.1f} GiB of memory ({profile.display_name})",
                f"give a cap of at most {profile.memory_bytes / 2**30:.1f} GiB or drop it")
        if cap <= 0:
            raise GraphoptError(f"device {name}: cap must be positive", "drop the cap or raise it")
        usable = min(cap, usable)
    return Device(name, profile, usable)


def parse_bandwidth(text: str) -> Link:
    """``"400Gb/s"`` (bits) or ``"50GB/s"`` (bytes) -> the network Link between machines."""
    m = _BW.match(text)
    if m is None or m.group(3) not in "bB" or float(m.group(1)) <= 0:
        raise GraphoptError(f"network bandwidth {text.strip()!r} is not a positive bandwidth",
                            _BW_FIX)
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    bytes_per_s = float(m.group(1)) * scale / (8 if m.group(3) == "b" else 1)
    return Link(f"net-{text.strip()}", bytes_per_s, _NET_LATENCY_S)


def make_device_set(devices: list[Device], hosts: dict[str, str] | None = None,
                    net: Link | None = None) -> DeviceSet:
    """A DeviceSet with the link of each ordered pair of distinct devices.

    Two devices of the same model share one profile object, and ``link_between`` reads an
    identical object as "the same device"; a copy of the profile gives the real link between
    two cards (NVLink, or PCIe through the host). ``hosts`` (device -> machine) and ``net``:
    devices on different machines are joined by the network (case 5).
    """
    hosts = hosts or {}
    names = [d.name for d in devices]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise GraphoptError(f"device name(s) {', '.join(dup)} given twice",
                            f"give each device its own name, {_EXAMPLE}")
    if not devices:
        raise GraphoptError("no devices given", f"name at least one, {_EXAMPLE}")
    check_device_count(len(devices))
    if len(set(hosts.get(d.name, "") for d in devices)) > 1 and net is None:
        raise GraphoptError("devices on several machines (@HOST) but no network between them",
                            f"add an item net=BANDWIDTH, like net=400Gb/s ({_BW_FIX})")
    links: dict[tuple[str, str], Link] = {}
    known: dict[tuple[int, int], Link] = {}  # one link per pair of profiles, not of devices
    for a in devices:
        for b in devices:
            if a.name != b.name and hosts.get(a.name, "") != hosts.get(b.name, ""):
                links[(a.name, b.name)] = net  # type: ignore[assignment]
            elif a.name != b.name:
                key = (id(a.profile), id(b.profile))
                if key not in known:
                    pb = dataclasses.replace(b.profile) if a.profile is b.profile else b.profile
                    known[key] = link_between(a.profile, pb)
                links[(a.name, b.name)] = known[key]
    return DeviceSet(tuple(devices), links)


def parse_devices(spec: str | Sequence[str]) -> DeviceSet:
    """Parse ``--devices`` (``cuda:0=h100,cuda:1=a100:40GB,cpu:8GB``) into a DeviceSet; a
    list or tuple of such items (Python's natural form) reads as the items joined by commas."""
    if isinstance(spec, (list, tuple)) and all(isinstance(s, str) for s in spec):
        spec = ",".join(spec)
    if spec is not None and not isinstance(spec, str):
        raise GraphoptError(f"devices={str(spec)[:80]!r} is a {type(spec).__name__}, not a "
                            "device list", f"give a string or a list of strings, {_EXAMPLE}")
    items = [s for s in (spec or "").split(",") if s.strip()]
    if not items:
        raise GraphoptError("--devices is empty", f"list the devices, {_EXAMPLE}")
    check_device_count(sum(1 for s in items if s.partition("=")[0].strip().lower() != "net"))
    devices = []
    hosts: dict[str, str] = {}
    net: Link | None = None
    for item in items:
        key, eq, value = item.partition("=")
        if eq and key.strip().lower() == "net":
            if net is not None:
                raise GraphoptError("net= given twice", "give the network bandwidth once")
            net = parse_bandwidth(value)
            continue
        host = ""
        if "@" in item:
            item, _, host = item.rpartition("@")
            if not host.strip() or not item.strip():
                raise GraphoptError(f"device {item.strip() + '@' + host!r} has an empty name "
                                    "or machine", f"write NAME[=TARGET][:CAP]@HOST, {_EXAMPLE}")
        name, target, cap_text = _split_item(item)
        if not name or (target is not None and not target):
            raise GraphoptError(f"device {item.strip()!r} has an empty name or target",
                                f"write NAME[=TARGET][:CAP], {_EXAMPLE}")
        try:
            cap = parse_size(cap_text) if cap_text is not None else None
        except GraphoptError as e:
            raise GraphoptError(f"device {item.strip()!r}: {e.problem}", e.fix) from None
        devices.append(_device(name, _profile_for(name, target, cap), cap))
        hosts[name] = host.strip()
    ds = make_device_set(devices, hosts, net)
    logger.info("devices: %s", ", ".join(
        f"{d.name}={d.profile.name} ({d.memory_bytes / 2**30:.1f} GiB usable)" for d in devices))
    return ds


def detect_devices() -> DeviceSet:
    """This machine: the host CPU plus every CUDA device torch sees that graphopt can describe."""
    devices = []
    for info in detect_gpus():
        try:
            profile = gpu_profile_for(info)
        except GraphoptError as exc:
            logger.warning("skipping cuda:%d (%s): %s", info.index, info.name, exc.problem)
            continue
        devices.append(_device(f"cuda:{info.index}", profile, None))
    devices.append(_device("cpu", host_cpu_profile(), None))
    return make_device_set(devices)
