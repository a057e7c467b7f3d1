"""Typed records that are their own JSON: one field per key, written and read back by type.

The plan's sections are frozen dataclasses deriving from :class:`Record`. ``to_json()`` writes
each field under its name (a record as an object, an enum as its value, a tuple as a list);
``from_json()`` reads the object back by the fields' type hints, so ``R.from_json(r.to_json())
== r`` for every record, and a key the record does not know is an error that names it, never a
silent ``None``. A field marked :func:`optional` is left out of the JSON while it holds its default
(None unless given), as the report has always done for keys that only some plans have; a field
whose JSON key is not a Python name (``from``) says its key with :func:`keyed`.

Numbers are not coerced: an ``int`` read into a ``float`` field stays an int, so the JSON bytes
written back are the bytes read.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from graphopt.errors import GraphoptError

__all__ = ["JSONValue", "Record", "keyed", "optional", "read_json", "write_json"]

#: a value JSON holds as it is (leaves the schema does not name further)
JSONValue = Any

R = TypeVar("R", bound="Record")

_OMIT = "graphopt_omit_default"
_KEY = "graphopt_json_key"


def optional(default: Any = None) -> Any:
    """A field left out of the JSON while it holds ``default`` (a key only some plans have)."""
    return dataclasses.field(default=default, metadata={_OMIT: True})


def keyed(key: str) -> Any:
    """A field written under JSON key ``key`` (one that is no Python name, such as ``from``)."""
    return dataclasses.field(metadata={_KEY: key})


def _key(f: dataclasses.Field[Any]) -> str:
    return f.metadata.get(_KEY, f.name)


class Record:
    """Base of the plan's typed sections: frozen dataclasses written and read by field."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in _fields(type(self)):
            value = getattr(self, f.name)
            if f.metadata.get(_OMIT) and (value is f.default or value == f.default):
                continue
            out[_key(f)] = write_json(value)
        return out

    @classmethod
    def from_json(cls: type[R], data: Any) -> R:
        return read_json(cls, data)


@functools.cache
def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(cls)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def write_json(value: Any) -> Any:
    """``value`` as JSON data: records as objects, enums as values, tuples as lists."""
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [write_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: write_json(v) for k, v in value.items()}
    return value


def read_json(tp: Any, data: Any, path: str = "") -> Any:
    """``data`` (parsed JSON) read as type ``tp``; a mismatch is a GraphoptError naming where."""
    if tp is Any:
        return data
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _read_union(tp, data, path)
    if origin in (tuple, list) or tp in (tuple, list):
        return _read_sequence(tp, data, path)
    if origin in (dict, Mapping) or origin is typing.get_origin(Mapping[str, int]):
        value_type = (typing.get_args(tp) or (str, Any))[1]
        _expect(isinstance(data, Mapping), data, "an object", path)
        return {k: read_json(value_type, v, f"{path}.{k}") for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, Record):
        return _read_record(tp, data, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            raise _error(data, f"one of {[m.value for m in tp]}", path) from None
    return _read_scalar(tp, data, path)


def _read_record(cls: type[R], data: Any, path: str) -> R:
    _expect(isinstance(data, Mapping), data, f"an object ({cls.__name__})", path)
    hints, known = _hints(cls), {_key(f): f for f in _fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise GraphoptError(f"plan JSON: {path or cls.__name__} has key(s) {unknown} that "
                            f"{cls.__name__} does not know; the file was written by another "
                            "graphopt version or edited: write it again with this one")
    kwargs = {f.name: read_json(hints[f.name], data[key], f"{path}.{key}")
              for key, f in known.items() if key in data}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field missing
        raise GraphoptError(f"plan JSON: {path or cls.__name__} is incomplete ({e}); write it "
                            "again with this graphopt version") from None


def _read_union(tp: Any, data: Any, path: str) -> Any:
    arms = [a for a in typing.get_args(tp) if a is not type(None)]
    if data is None:
        _expect(len(arms) < len(typing.get_args(tp)), data, str(tp), path)
        return None
    if len(arms) == 1:
        return read_json(arms[0], data, path)
    for arm in arms:  # several arms: the first whose shape matches
        try:
            return read_json(arm, data, path)
        except GraphoptError:
            continue
    raise _error(data, str(tp), path)


def _read_sequence(tp: Any, data: Any, path: str) -> Any:
    _expect(isinstance(data, (list, tuple)), data, "a list", path)
    args = typing.get_args(tp)
    if not args:
        return tuple(data)
    if len(args) == 2 and args[1] is Ellipsis or typing.get_origin(tp) is list:
        items = tuple(read_json(args[0], v, f"{path}[{i}]") for i, v in enumerate(data))
        return list(items) if typing.get_origin(tp) is list else items
    _expect(len(args) == len(data), data, f"{len(args)} items", path)
    return tuple(read_json(a, v, f"{path}[{i}]")
                 for i, (a, v) in enumerate(zip(args, data, strict=True)))


def _read_scalar(tp: Any, data: Any, path: str) -> Any:
    if tp is float:  # an int stays an int: the bytes written back are the bytes read
        ok = isinstance(data, (int, float)) and not isinstance(data, bool)
    elif tp is int:
        ok = isinstance(data, int) and not isinstance(data, bool)
    elif tp in (str, bool):
        ok = isinstance(data, tp)
    elif tp is type(None):
        ok = data is None
    else:
        raise GraphoptError(f"plan JSON: no reader for type {tp!r} at {path}")
    _expect(ok, data, tp.__name__, path)
    return data


def _expect(ok: bool, data: Any, wanted: str, path: str) -> None:
    if not ok:
        raise _error(data, wanted, path)


def _error(data: Any, wanted: str, path: str) -> GraphoptError:
    shown = repr(data)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return GraphoptError(f"plan JSON: {path or 'the value'} is {shown}, expected {wanted}; "
                         "write the file again with this graphopt version")
