"""Value records without ``dataclasses``: the methods a dataclass writes, written once.

Creating a dataclass writes its ``__init__``, ``__eq__`` and ``__repr__`` (``__hash__``,
``__setattr__`` when frozen) as source and compiles them: ~0.6-1 ms of CPU per class in
Python 3.11, paid at import by every run, and a cold CLI run imports dozens.

A subclass lists its fields in ``__slots__`` and ``_fields`` (definition order: the
order of the repr and of the comparison) and writes its own ``__init__``. Guarantees, as
a dataclass's (tests/test_cold_records.py):

- equality only between instances of the same class, over the fields not named in
  ``_uncompared`` (a dataclass's ``compare=False``), in field order;
- ``repr`` is ``Name(field=value, ...)`` over every field;
- a ``Record`` is unhashable; a ``FrozenRecord`` hashes its compared fields and refuses
  to have a field assigned again or deleted (``AttributeError``); its fields are
  ``Final`` so mypy refuses it too.
"""

from __future__ import annotations

from typing import ClassVar


class Record:
    """A mutable value record: equal by value, unhashable."""

    __slots__ = ()
    #: the fields in definition order (``__slots__`` is kept sorted)
    _fields: ClassVar[tuple[str, ...]] = ()
    #: fields left out of equality and hash
    _uncompared: ClassVar[frozenset[str]] = frozenset()

    def _key(self) -> tuple[object, ...]:
        return tuple(getattr(self, n) for n in self._fields if n not in self._uncompared)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record) or other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable: equal by value, not hashable

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__qualname__}({shown})"


class FrozenRecord(Record):
    """An immutable value record: each field is set once, by ``__init__``."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]  # frozen: hashable again
        return hash(self._key())

    def __setattr__(self, name: str, value: object) -> None:
        if hasattr(self, name):
            raise AttributeError(f"cannot assign to field {name!r} of a frozen record")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a frozen record")
