"""The user's model and inputs are never written: graphopt runs private copies, then checks.

A ``forward`` may write state that is not (only) a registered buffer: transformers'
``StaticCache`` keeps its K/V tensors on a cache object (and registers the same tensors as
buffers), a module may keep a counter tensor as a plain attribute, or take a holder object
among its inputs. torch.export swaps only the registered names for fakes and
``torch.func.functional_call`` only the registered tensors for copies, so such a write lands
in the user's tensor, and with grad on leaves it with autograd history that ``copy.deepcopy``
then refuses ("Only Tensors created explicitly by the user support the deepcopy protocol").

- :func:`reachable_tensors`: every tensor an object reaches, registered or held by an
  attribute, a holder object, a list, tuple or dict (each once, by its first path; registered
  names first; depth and count bounded).
- :func:`private_copy`: a deep copy with every such tensor copied, aliases kept (a buffer also
  held by a cache object is one tensor in the copy too) and tensors with autograd history
  cloned under no_grad. Parameters may be shared where nothing writes them (tracing, timing).
- :func:`user_state_guard`: snapshots what the user owns and compares on exit; whatever
  changed anyway (a value, autograd history, the object an attribute holds) is put back and a
  GraphoptError names it.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import logging
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.parameter import UninitializedTensorMixin

from graphopt.errors import GraphoptError, first_line
from graphopt.files.quiet import library_quiet

__all__ = ["Snapshot", "clone_inputs", "private_copy", "reachable_tensors", "run_and_watch",
           "user_state_guard"]

logger = logging.getLogger(__name__)

_DEPTH = 8  # attribute hops below a module or an input
_OBJECTS = 200_000  # objects visited at most: a walk never costs more than the call it guards
_ATOMIC = (str, bytes, bytearray, int, float, complex, bool, type(None), type, range, slice,
           types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
           enum.Enum, torch.dtype, torch.device, torch.Size, fx.Graph, fx.Node, logging.Logger,
           torch.export.ExportedProgram)
_MODULE_OWN = frozenset({"_parameters", "_buffers", "_modules"})
_MISSING = object()
_FIX = ("graphopt runs private copies of every tensor it finds on the model (registered, on "
        "attributes, holder objects, lists and dicts) and in the inputs: keep the state forward "
        "writes there, not in a global or a closure, and keep the model copyable with "
        "copy.deepcopy; if both hold, report this as a graphopt bug")


@dataclass(frozen=True)
class _Slot:
    """Where a tensor is held: ``holder.key`` (an attribute) or ``holder[key]``."""

    holder: Any
    key: Any
    attr: bool
    name: str

    def get(self) -> Any:
        if self.attr:
            return vars(self.holder).get(self.key, _MISSING)
        try:
            return self.holder[self.key]
        except (KeyError, IndexError):
            return _MISSING

    def put(self, value: Any) -> None:
        if self.attr:
            object.__setattr__(self.holder, self.key, value)
        else:
            self.holder[self.key] = value


@dataclass
class _Walk:
    """Depth-first over modules (registered tensors first), then attributes and containers."""

    tensors: dict[int, tuple[str, torch.Tensor]] = field(default_factory=dict)
    slots: list[tuple[_Slot, torch.Tensor]] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    left: int = _OBJECTS

    def tensor(self, t: torch.Tensor, name: str, slot: _Slot | None) -> None:
        if isinstance(t, (FakeTensor, UninitializedTensorMixin)):
            return  # tracing's stand-ins and lazy modules' placeholders hold no state
        self.tensors.setdefault(id(t), (name, t))
        if slot is not None:
            self.slots.append((slot, t))

    def module(self, root: nn.Module, prefix: str) -> None:
        tree = [(n, m) for n, m in root.named_modules(prefix=prefix) if id(m) not in self.seen]
        for name, m in tree:
            self.seen.add(id(m))
            for kind in ("_parameters", "_buffers"):
                store = m.__dict__.get(kind) or {}
                for key, t in list(store.items()):
                    if isinstance(t, torch.Tensor):
                        self.tensor(t, _join(name, key), _Slot(store, key, False,
                                                               _join(name, key)))
        for name, m in tree:
            for key, value in list(vars(m).items()):
                if key not in _MODULE_OWN:
                    self.value(value, _join(name, key), 1, _Slot(m, key, True, _join(name, key)))

    def value(self, v: Any, name: str, depth: int, slot: _Slot | None) -> None:
        if isinstance(v, torch.Tensor):
            self.tensor(v, name, slot)
            return
        if depth > _DEPTH or isinstance(v, _ATOMIC) or id(v) in self.seen or self.left <= 0:
            return
        if isinstance(v, nn.Module):
            self.module(v, name)
            return
        self.seen.add(id(v))
        self.left -= 1
        for key, child, where in _children(v, name):
            self.value(child, where, depth + 1, None if key is _MISSING else
                       _Slot(v, key, not isinstance(v, (list, dict)), where))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _children(v: Any, name: str) -> Iterator[tuple[Any, Any, str]]:
    """(key or _MISSING when it cannot be rebound, child, path) of a container or object."""
    if isinstance(v, list):
        yield from ((i, x, f"{name}[{i}]") for i, x in enumerate(list(v)))
    elif isinstance(v, tuple):
        yield from ((_MISSING, x, f"{name}[{i}]") for i, x in enumerate(v))
    elif isinstance(v, dict):
        yield from ((k, x, f"{name}[{k!r}]") for k, x in list(v.items()))
    elif isinstance(v, (set, frozenset)):
        yield from ((_MISSING, x, f"{name}{{}}") for x in list(v))
    else:
        own = getattr(v, "__dict__", None)
        if isinstance(own, dict):
            yield from ((k, x, _join(name, k)) for k, x in list(own.items()))
        for cls in type(v).__mro__:
            slots = getattr(cls, "__slots__", ())
            for s in (slots,) if isinstance(slots, str) else slots:
                x = getattr(v, s, _MISSING) if s not in ("__dict__", "__weakref__") else _MISSING
                if x is not _MISSING:
                    yield (_MISSING, x, _join(name, s))


def _walk(model: Any, inputs: Any = _MISSING) -> _Walk:
    walk = _Walk()
    walk.value(model, "", 0, None)
    if inputs is not _MISSING:
        walk.value(inputs, "inputs", 0, None)
    return walk


def reachable_tensors(model: Any, inputs: Any = _MISSING) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor ``model`` and ``inputs`` reach, each tensor once:
    ``lin.weight``, ``static_cache.layers[0].keys``, ``inputs[0]``."""
    return list(_walk(model, inputs).tensors.values())


def run_and_watch(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                  ) -> tuple[Any, list[str]]:
    """``model(*args, **kwargs)`` under no_grad, and the paths of the tensors the call wrote
    (a model with state of its own: a static KV cache, a counter), each put back after."""
    snap = Snapshot(model)
    with torch.no_grad():
        out = model(*args, **kwargs)
    restored, lost = snap.restore()
    return out, list(dict.fromkeys(r.rsplit(" (", 1)[0] for r in (*restored, *lost)))


def private_copy(obj: Any, *, share_parameters: bool = False) -> Any:
    """``copy.deepcopy(obj)`` where every reachable tensor is a copy (aliases kept); one with
    autograd history is cloned, detached, under no_grad. ``share_parameters`` keeps the
    ``nn.Parameter`` objects themselves (for runs that never write them)."""
    memo: dict[int, Any] = {}
    with torch.no_grad():
        for _, t in _walk(obj).tensors.values():
            if share_parameters and isinstance(t, nn.Parameter):
                memo[id(t)] = t
            elif not t.is_leaf:  # deepcopy refuses these; a leaf copies with its views
                memo[id(t)] = t.detach().clone()
        try:
            with library_quiet(stderr=False):  # torch's copyreg FutureWarning on a pytree spec
                return copy.deepcopy(obj, memo)
        except Exception as e:  # noqa: BLE001 - any object the model holds may refuse
            first = obj[0] if isinstance(obj, tuple) and obj else obj  # (model, inputs)
            raise GraphoptError(f"could not copy {type(first).__name__} with copy.deepcopy "
                                f"({first_line(e)})", _FIX) from None


def clone_inputs(args: Any) -> Any:
    """``args`` with every tensor it reaches a detached clone: tuples, lists, dicts and holder
    objects are copied too, with aliases kept."""
    if isinstance(args, torch.Tensor):
        return args.detach().clone()
    with torch.no_grad():
        memo: dict[int, Any] = {id(t): t.detach().clone()
                                for _, t in _walk(args).tensors.values()}
    if not memo:
        return args
    try:
        return copy.deepcopy(args, memo)
    except Exception:  # noqa: BLE001 - an object that refuses a copy: rebuild the containers
        logger.debug("inputs not deep-copyable; cloned container by container", exc_info=True)
        return _rebuilt(args, memo)


def _rebuilt(args: Any, memo: dict[int, Any]) -> Any:
    if isinstance(args, torch.Tensor):
        return memo.get(id(args), args)
    if isinstance(args, list) or type(args) is tuple:
        return type(args)(_rebuilt(a, memo) for a in args)
    if isinstance(args, dict):
        return {k: _rebuilt(v, memo) for k, v in args.items()}
    return args


@dataclass
class _Record:
    name: str
    tensor: torch.Tensor
    version: int | None
    leaf: bool
    requires_grad: bool
    value: torch.Tensor | None  # None: a parameter (its version counter tells), or no data


class Snapshot:
    """What ``model`` and ``inputs`` hold now; :meth:`restore` puts back what changed since.

    Values are saved for every tensor but parameters (a copy of the weights would double the
    model's memory): a parameter is checked by its version counter, which every in-place
    write bumps, and by its autograd state.
    """

    def __init__(self, model: Any, inputs: Any = _MISSING, skip: frozenset[int] = frozenset()
                 ) -> None:
        walk = _walk(model, inputs)
        self.slots = [(s, t) for s, t in walk.slots if id(t) not in skip]
        with torch.no_grad():
            self.records = [_record(name, t) for name, t in walk.tensors.values()
                            if id(t) not in skip]

    def ids(self) -> frozenset[int]:
        return frozenset(id(r.tensor) for r in self.records)

    def restore(self) -> tuple[list[str], list[str]]:
        """Put back what changed: (``"name (what)"`` restored, ``"name (what)"`` that could
        not be). A view that gained autograd history cannot drop it in place: the model's
        attributes then hold a detached tensor on the same storage in its stead."""
        restored: list[str] = []
        lost: list[str] = []
        stand_in: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for r in self.records:
                for what, ok in _put_back(r, stand_in):
                    (restored if ok else lost).append(f"{r.name} ({what})")
        for slot, t in self.slots:
            want = stand_in.get(id(t), t)
            if slot.get() is not want:
                try:
                    slot.put(want)
                except Exception:  # noqa: BLE001 - a holder that refuses the assignment
                    lost.append(f"{slot.name} (another object was put there)")
                    continue
                if want is t:
                    restored.append(f"{slot.name} (another object was put there)")
        return restored, lost


def _version(t: torch.Tensor) -> int | None:
    try:
        return int(t._version)
    except RuntimeError:  # an inference tensor keeps no version counter
        return None


def _record(name: str, t: torch.Tensor) -> _Record:
    keep = not isinstance(t, nn.Parameter) and t.layout is torch.strided and not t.is_meta
    return _Record(name, t, _version(t), t.is_leaf, t.requires_grad,
                   t.detach().clone() if keep else None)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (a NaN equals the same NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    try:
        return torch.equal(a.detach().reshape(-1).view(torch.uint8),
                           b.reshape(-1).view(torch.uint8))
    except RuntimeError:  # a dtype with no byte view
        return bool(torch.equal(a, b))


def _put_back(r: _Record, stand_in: dict[int, torch.Tensor]) -> Iterator[tuple[str, bool]]:
    """(what changed, whether it is back) for one tensor; runs under no_grad."""
    t = r.tensor
    if r.value is not None and not _same(t, r.value):
        same_form = t.shape == r.value.shape and t.dtype == r.value.dtype
        yield "value", _try(lambda: t.copy_(r.value) if same_form else t.set_(r.value))
    elif r.value is None and r.version is not None and _version(t) != r.version:
        yield "written in place; its value was not saved", False
    if r.leaf and not t.is_leaf:
        if not _try(t.detach_):  # a view: the model holds a detached one instead
            stand_in[id(t)] = t.detach().requires_grad_(r.requires_grad)
        yield "autograd history", True
    if t.is_leaf and t.requires_grad != r.requires_grad:
        yield "requires_grad", _try(lambda: t.requires_grad_(r.requires_grad))


def _try(change: Any) -> bool:
    try:
        change()
    except RuntimeError:
        logger.debug("could not restore a tensor", exc_info=True)
        return False
    return True


_GUARDED: set[int] = set()  # the tensors an enclosing guard already watches


@contextlib.contextmanager
def user_state_guard(model: Any, inputs: Any = _MISSING, what: str = "graphopt"
                     ) -> Iterator[None]:
    """Check, on exit, that every tensor ``model`` and ``inputs`` reach is as it was; put back
    what changed and raise a GraphoptError naming it (after an exception from the body, put
    it back and let that exception through). A guard inside another watches only the
    tensors the outer one does not."""
    snap = Snapshot(model, inputs, skip=frozenset(_GUARDED))
    mine = snap.ids()
    _GUARDED.update(mine)
    done = False
    try:
        yield
        done = True
    finally:
        _GUARDED.difference_update(mine)
        restored, lost = snap.restore()
        if (restored or lost) and not done:
            logger.warning("%s changed the user's tensors and failed; put back: %s",
                           what, ", ".join(restored + lost))
        elif restored or lost:
            raise GraphoptError(
                f"{what} changed tensors the user owns: "
                + (f"{', '.join(restored)}; restored them" if restored else "")
                + ("; " if restored and lost else "")
                + (f"could not restore {', '.join(lost)}" if lost else ""), _FIX)
