"""Target names -> profiles: the one lookup the CLI and the cost model use.

Names are matched case-insensitively and ignoring punctuation, so ``RTX-4090``, ``rtx_4090`` and
``rtx4090`` are one target. ``cpu``/``host`` is the detected host CPU; ``gpu``/``cuda`` (or
``cuda:N``) is a CUDA device of this machine; a path ending in ``.json`` is a profile file
(``graphopt calibrate`` writes one).
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Sequence
from typing import Any

from graphopt.errors import GraphoptError, UnknownTargetError
from graphopt.hardware.cpus import CPU_PROFILES, cpu_profiles
from graphopt.hardware.detect import detected_gpu_profiles, host_cpu_profile
from graphopt.hardware.gpus import GPU_PROFILES, gpu_profiles
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.profile_file import is_profile_path, load_profile

__all__ = ["ALIASES", "DEFAULT_TARGET", "TargetSpec", "aliases_of", "get_target",
           "memory_variant", "is_this_machine",
           "list_targets", "not_a_target", "resolve_targets", "target_names"]

#: the target plan, optimize, plan_llm and the CLI use when none is given (profile and
#: calibrate measure this machine, so theirs is "cpu")
DEFAULT_TARGET = "h100"

#: a target as the API takes it: a name, "a100,h100", a profile, or a list of either
TargetSpec = str | HardwareProfile | Sequence[str | HardwareProfile]

logger = logging.getLogger(__name__)

HOST_NAMES = ("cpu", "host")
_DETECTED_GPU = re.compile(r"^(?:gpu|cuda)(?::(\d+))?$")

# Extra spellings -> canonical table name. The bare family name picks the flagship variant.
ALIASES: dict[str, str] = {
    "h100": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "a100": "a100-80gb",
    "a100-sxm": "a100-80gb",
    "a100-40g": "a100-40gb",
    "a100-80g": "a100-80gb",
    "h200-sxm": "h200",
    "v100-sxm2": "v100",
    "v100-32gb": "v100",
    "tesla-t4": "t4",
    "3090": "rtx-3090",
    "4090": "rtx-4090",
    "5090": "rtx-5090",
    "geforce-rtx-3090": "rtx-3090",
    "geforce-rtx-4090": "rtx-4090",
    "geforce-rtx-5090": "rtx-5090",
    "6000-ada": "rtx-6000-ada",
    "rtx-6000": "rtx-6000-ada",
    "milan": "epyc-7763",
    "zen3": "epyc-7763",
    "icelake": "xeon-8380",
    "ice-lake": "xeon-8380",
    "sapphire-rapids": "xeon-8480",
    "spr": "xeon-8480",
    "genoa": "epyc-9654",
    "zen4": "epyc-9654",
    "neoverse-v1": "graviton3",
}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _table() -> dict[str, HardwareProfile]:
    return {**GPU_PROFILES, **CPU_PROFILES}


def _lookup() -> dict[str, str]:
    keys = {_key(n): n for n in _table()}
    keys.update({_key(alias): target for alias, target in ALIASES.items()})
    return keys


def target_names() -> list[str]:
    """Canonical names in listing order: GPUs, reference CPUs, then the host."""
    return [*GPU_PROFILES, *CPU_PROFILES, "cpu"]


#: names of hardware the database does not hold, by what they are: a suggestion from another
#: vendor's table (``mi300x`` -> ``3090``) would be wrong, so the error says so plainly
_NOT_COVERED = (
    (re.compile(r"^(mi\d|instinct|radeon|rx\d|navi|cdna|rdna)"), "AMD GPUs (Instinct, Radeon)"),
    (re.compile(r"^(gaudi|habana|arc|max\d|ponte)"), "Intel accelerators (Gaudi, Arc, Max)"),
    (re.compile(r"^(tpu|v[45]e|v5p)"), "Google TPUs"),
    (re.compile(r"^(trainium|trn\d|inferentia|inf\d)"), "AWS Trainium and Inferentia"),
    (re.compile(r"^(apple|m[1-4](pro|max|ultra)?$)"), "Apple silicon"),
)
#: name patterns -> the part of the table a near miss should come from
_FAMILIES = (
    (re.compile(r"^(xeon|epyc|graviton|neoverse|ryzen|core|zen|milan|genoa|icelake|spr)"),
     "cpu"),
    (re.compile(r"^(nvidia|tesla|geforce|rtx|gtx|quadro|[abhlvtg]\d)"), "gpu"),
)


def aliases_of(name: str) -> list[str]:
    """The other spellings ``get_target`` takes for the canonical target ``name``."""
    return [alias for alias, target in ALIASES.items() if target == name]


def _suggestion(name: str) -> str:
    """A near miss from the same kind of hardware, or a plain word that it is not covered."""
    key = name.strip().lower()
    for pattern, what in _NOT_COVERED:
        if pattern.match(key):
            return (f"graphopt's database has no {what}: it covers NVIDIA GPUs and x86/Arm "
                    "CPUs; give a profile file (`graphopt calibrate` writes one for a CPU), or")
    kind = next((k for pattern, k in _FAMILIES if pattern.match(key)), None)
    table = _table()
    spellings = [n for n in [*table, *ALIASES]
                 if kind is None or table[ALIASES.get(n, n)].kind == kind]
    close = difflib.get_close_matches(key, spellings, n=1, cutoff=0.5 if kind else 0.6)
    return f"did you mean {close[0]!r}?" if close else ""


def _unknown(name: str, fix: str | None = None) -> UnknownTargetError:
    known = target_names()
    if fix is None:
        hint = _suggestion(name)
        fix = f"{hint + ' ' if hint else ''}run `graphopt targets` to list them (aliases too)"
    return UnknownTargetError(f"unknown target {name!r}; known targets: {', '.join(known)}", fix)


def not_a_target(value: object) -> UnknownTargetError:
    """The error for a target that is not a name at all (``None``, ``123``): what fits."""
    return UnknownTargetError(
        f"target={value!r} ({type(value).__name__}) is not a target",
        "give a target name ('h100', 'cpu'; `graphopt targets` lists them), several "
        "('a100,h100' or a list of names), or a graphopt HardwareProfile")


def get_target(name: str) -> HardwareProfile:
    """The profile for a target name or alias; unknown names raise UnknownTargetError."""
    if not isinstance(name, str):
        raise not_a_target(name)
    lowered = name.strip().lower()
    if is_profile_path(name):
        return load_profile(name.strip())
    if lowered in HOST_NAMES:
        return host_cpu_profile()
    m = _DETECTED_GPU.match(lowered)
    if m:
        gpus = detected_gpu_profiles()
        index = int(m.group(1) or 0)
        if index >= len(gpus):
            raise _unknown(name, f"this machine has {len(gpus)} usable CUDA device(s); "
                                 "name a GPU from the table instead, e.g. 'h100'")
        return gpus[index]
    canonical = _lookup().get(_key(lowered))
    if canonical is None:
        raise _unknown(name)
    return _table()[canonical]


def memory_variant(name: str, nbytes: int) -> HardwareProfile | None:
    """The table's own model of a family alias with ``nbytes`` of memory: ``a100`` with 40 GB
    is the A100 40GB (its own bandwidth), not the 80 GB card capped. None when ``name`` is
    not a family alias (``a100-80gb:40GB`` caps that card) or no variant has that memory
    (within 10%: a datasheet's 40 GB is 40 GiB, and either spelling names the card)."""
    canonical = ALIASES.get(name.strip().lower())
    if canonical is None or not nbytes:
        return None
    family = _table()[canonical]
    prefix = canonical.split("-")[0]
    for key, p in _table().items():
        if (key.split("-")[0] == prefix and p.generation == family.generation
                and abs(p.memory_bytes - nbytes) <= 0.1 * nbytes):
            return p
    return None


def is_this_machine(profile: HardwareProfile) -> bool:
    """True for the detected host CPU, or a calibration of this CPU model (``graphopt
    calibrate``): the targets whose kernels can be timed here."""
    host = host_cpu_profile()
    if profile.kind != "cpu" or profile.name != host.name:
        return False
    return _cpu_model(profile) == _cpu_model(host)


def _cpu_model(profile: HardwareProfile) -> str:
    return profile.display_name.split(" (host")[0]


def list_targets() -> list[HardwareProfile]:
    """Every target in a stable order: GPU table, reference CPUs, then the detected host."""
    return [*gpu_profiles(), *cpu_profiles(), host_cpu_profile()]


def resolve_targets(target: TargetSpec) -> list[HardwareProfile]:
    """``"a100,h100"``, a list of names or profiles, or one of them -> profiles, in order.
    Anything else (``None``, a number, a torch device) is a GraphoptError saying what fits."""
    if isinstance(target, HardwareProfile):
        return [target]
    if isinstance(target, str):
        items: list[Any] = target.split(",")
    elif isinstance(target, Sequence) and not isinstance(target, (bytes, bytearray)):
        items = list(target)
    else:
        raise not_a_target(target)
    profiles = [t if isinstance(t, HardwareProfile) else
                get_target(t.strip() if isinstance(t, str) else t)
                for t in items if not isinstance(t, str) or t.strip()]
    if not profiles:
        raise GraphoptError("no target given", "name one, e.g. target='h100' (see "
                            "`graphopt targets`)")
    return profiles
