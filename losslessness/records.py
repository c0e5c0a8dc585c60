"""Validation of JSON records against the dataclasses they are read into.

A saved audit record (``report.json``) or a shard file's unit records come from disk, so from
anyone: :func:`validate_record` checks a parsed JSON value against the field types of the
dataclass it will become, before any loader touches it, and names the first wrong field by
its path (``targets[0].checks[3].p_value: expected a number, got 'abc'``). The schema is the
dataclasses' own type hints, so a field added to a record type is validated without a second
description of it to keep in step.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import reprlib
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from typing import Any

_INT64 = range(-(2**63), 2**63)
"""What an integer field holds: the record's integers are numpy int64 where they are used."""

_VALUE_REPR = reprlib.Repr()
_VALUE_REPR.maxstring = 60
_VALUE_REPR.maxother = 60
_VALUE_REPR.maxlist = _VALUE_REPR.maxdict = 4
"""How an offending value is quoted in an error: bounded, so that a hostile 2 MB string makes a
short message."""


class RecordError(ValueError):
    """A JSON record that does not have the shape of its type; the message starts with the path
    of the offending field (``targets[0].checks[3].p_value: ...``)."""


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _got(value: Any) -> str:
    if isinstance(value, dict):
        return f"an object {_VALUE_REPR.repr(value)}"
    if isinstance(value, list):
        return f"an array {_VALUE_REPR.repr(value)}"
    if value is None:
        return "null"
    return _VALUE_REPR.repr(value)


def _wrong(path: str, kind: Any, value: Any) -> RecordError:
    """The error for ``value`` at ``path`` where a value of type ``kind`` belongs."""
    return RecordError(f"{path or 'the record'}: expected {_expected(kind)}, got {_got(value)}")


@functools.cache
def _field_types(kind: type) -> tuple[dict[str, Any], frozenset[str]]:
    """The resolved type of every field of dataclass ``kind`` and the names of those without
    a default (a record must hold them)."""
    hints = typing.get_type_hints(kind)
    fields = dataclasses.fields(kind)
    required = frozenset(
        field.name
        for field in fields
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    )
    return {field.name: hints[field.name] for field in fields if field.init}, required


def _expected(kind: Any) -> str:
    """What a value of type ``kind`` looks like in JSON, for messages."""
    if kind is str:
        return "a string"
    if kind is bool:
        return "true or false"
    if kind is int:
        return "a 64-bit integer"
    if kind is float:
        return "a number"
    if kind is type(None):
        return "null"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(repr(member.value) for member in kind)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return f"an object ({kind.__name__})"
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(arm) for arm in typing.get_args(kind))
    if origin in (dict, Mapping):
        return "an object"
    return "an array"


class _Validator:
    """One validation: the field names whose float may be null, and those not checked."""

    def __init__(self, nullable_floats: Collection[str], opaque: Collection[str]) -> None:
        self.nullable_floats = frozenset(nullable_floats)
        self.opaque = frozenset(opaque)

    def check(self, value: Any, kind: Any, path: str, name: str = "") -> None:
        """Raise :class:`RecordError` naming ``path`` unless ``value`` is a JSON value of type
        ``kind``; ``name`` is the field's own name (for ``nullable_floats`` and ``opaque``)."""
        if kind is Any or name in self.opaque:
            return
        if kind is float and value is None and name in self.nullable_floats:
            return
        origin = typing.get_origin(kind)
        if origin in (typing.Union, types.UnionType):
            self._check_union(value, kind, path, name)
        elif dataclasses.is_dataclass(kind):
            self._check_object(value, typing.cast(type, kind), path)
        elif origin in (dict, Mapping):
            self._check_mapping(value, kind, path)
        elif origin in (list, tuple, Sequence):
            self._check_array(value, kind, path)
        elif not self._scalar_ok(value, kind):
            raise _wrong(path, kind, value)

    @staticmethod
    def _scalar_ok(value: Any, kind: Any) -> bool:
        if kind is type(None):
            return value is None
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            return isinstance(value, str) and value in {member.value for member in kind}
        if kind is float:
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is int:
            # Counts and seeds become numpy int64 where the reports plot them.
            return isinstance(value, int) and not isinstance(value, bool) and value in _INT64
        if kind in (str, bool):
            return isinstance(value, kind)
        raise TypeError(f"validate_record: no JSON form known for the type {kind!r}")

    def _check_union(self, value: Any, kind: Any, path: str, name: str) -> None:
        arms = typing.get_args(kind)
        if value is None and type(None) in arms:
            return
        others = [arm for arm in arms if arm is not type(None)]
        if len(others) == 1:
            self.check(value, others[0], path, name)
            return
        for arm in others:
            try:
                self.check(value, arm, path, name)
            except RecordError:
                continue
            return
        raise _wrong(path, kind, value)

    def _check_object(self, value: Any, kind: type, path: str) -> None:
        if not isinstance(value, dict):
            raise _wrong(path, kind, value)
        types_by_name, required = _field_types(kind)
        for key in value:
            if key not in types_by_name:
                where = path or "the record"
                raise RecordError(f"{where}: unknown field {_got(key)} of {kind.__name__}")
        missing = [key for key in types_by_name if key in required and key not in value]
        if missing:
            raise RecordError(f"{_join(path, missing[0])}: missing")
        for key, item in value.items():
            self.check(item, types_by_name[key], _join(path, key), key)

    def _check_mapping(self, value: Any, kind: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise _wrong(path, kind, value)
        key_type, item_type = typing.get_args(kind) or (Any, Any)
        for key, item in value.items():
            self.check(key, key_type, f"{path} key {_got(key)}")
            self.check(item, item_type, f"{path}[{_got(key)}]")

    def _check_array(self, value: Any, kind: Any, path: str) -> None:
        if not isinstance(value, list):
            raise _wrong(path, kind, value)
        arguments = typing.get_args(kind)
        if typing.get_origin(kind) is tuple and arguments[-1:] != (Ellipsis,):
            if len(value) != len(arguments):
                raise RecordError(
                    f"{path}: expected an array of {len(arguments)} items, got {len(value)}"
                )
            item_types = list(arguments)
        else:
            item_types = [arguments[0] if arguments else Any] * len(value)
        for index, (item, item_type) in enumerate(zip(value, item_types, strict=True)):
            self.check(item, item_type, f"{path}[{index}]")


def validate_record(
    value: Any,
    kind: type,
    *,
    path: str = "",
    nullable_floats: Collection[str] = (),
    opaque: Collection[str] = (),
) -> None:
    """Check that ``value``, parsed JSON, has the shape of dataclass ``kind``.

    JSON forms: a dataclass is an object with its fields (those with a default may be missing;
    unknown keys are rejected); an enum is one of its string values; ``list``, ``tuple`` and
    ``Sequence`` are arrays (a fixed-length tuple one of that length); ``dict`` and
    ``Mapping`` are objects; ``float`` is any number, ``int`` an integer in the int64 range
    (``true``/``false`` are neither); ``X | None`` also takes ``null``; ``Any`` takes anything.

    Args:
        value: what :func:`json.loads` returned.
        kind: the dataclass the value is read into (its type hints are the schema).
        path: the path of ``value`` in a larger record (prefixed to every message).
        nullable_floats: names of float fields that may be ``null`` (the writer's form of a
            non-finite float, read back by the loader, e.g. ``min_detectable_tv`` as inf).
        opaque: names of fields not checked here, whose JSON form is not their type's
            (their own reader validates them).

    Raises:
        RecordError: naming the path of the first field that is missing, unknown or of the
            wrong type, what was expected and (shortened) what was found.
        TypeError: ``kind`` has a field of a type with no JSON form here (a programming
            error in the record types, never in the record).
    """
    _Validator(nullable_floats, opaque).check(value, kind, path)
