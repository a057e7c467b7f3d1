"""Model outputs that torch's tracers cannot see into: plain dataclasses.

``torch.export`` flattens a model's outputs with pytree, which knows tuples, lists, dicts,
namedtuples and the types registered with it (transformers registers its ``ModelOutput``).
A plain ``@dataclass`` holding the result is a leaf to it: export refuses it, and make_fx's
graph returns the object as one opaque value, so a plan of Linear + ReLU returning
``Out(y=...)`` would have one node and no FLOPs. :func:`register_dataclasses` registers such
types with ``torch.export.register_dataclass`` (what torch's docs tell a user to do), after
which export keeps the compute and the optimized module returns the same type.
:func:`as_plain` is the fallback's view: each dataclass as a dict of its fields.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["as_plain", "register_dataclasses"]

logger = logging.getLogger(__name__)


def _unregistered(value: Any) -> bool:
    return (dataclasses.is_dataclass(value) and not isinstance(value, type)
            and type(value) not in pytree.SUPPORTED_NODES)


def as_plain(value: Any, found: list[type]) -> Any:
    """``value`` with every unregistered dataclass instance turned into a dict of its fields,
    recursively; the types met are appended to ``found`` (once each)."""
    if _unregistered(value):
        if type(value) not in found:
            found.append(type(value))
        return {f.name: as_plain(getattr(value, f.name), found)
                for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(as_plain(v, found) for v in value)
    if isinstance(value, dict):
        return {k: as_plain(v, found) for k, v in value.items()}
    return value


def register_dataclasses(types: list[type]) -> list[str]:
    """Register each of ``types`` for torch.export; returns the names of those registered.

    A type torch refuses (or one registered meanwhile) is skipped: tracing then falls back as
    before, with a warning.
    """
    done = []
    for cls in types:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if cls in pytree.SUPPORTED_NODES:
            continue
        try:
            torch.export.register_dataclass(cls, serialized_type_name=name)
        except (TypeError, ValueError) as e:  # e.g. a field torch cannot flatten
            logger.debug("cannot register %s for torch.export: %s", name, e)
            continue
        done.append(cls.__qualname__)
    return done
