"""`record`: a dataclass quicker to define: a third of the compiles (a frozen class compiles only
its `__init__`) on CPython 3.11 and 3.12, less source to compile from 3.13.

`dataclasses.dataclass` writes each method it adds as source text and compiles it: six for a
frozen class (`__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__`, `__delattr__`), three
for a mutable one (from CPython 3.13, all of them in one compile of the same source). The
compiles are nearly all of a dataclass's cost, about half a millisecond a class on the
development machine, and the classes on the path of `mpvisor run` (specs, outcomes, the actor's
and the attempt's states, the configuration) cost a run 26-30 ms of its start-up on CPython
3.11 in 189 compiles; with `record`, 30 compiles (one `__init__` a class) and about 8 % fewer
instructions for the whole of `import mpvisor._cli.run` than when it compiled the frozen
classes' `__setattr__` and `__delattr__` too (from 3.13, `record` compiles less source in each
class's one compile).

`record` takes the same arguments as `dataclass` (those mpvisor uses) and makes the same class,
a real dataclass: `dataclasses.fields`, `replace`, `asdict`, pickling, `__match_args__`, slots
and frozenness are dataclasses' own. Only `__repr__`, `__eq__` and `__hash__`, and up to 3.12 a
frozen class's `__setattr__` and `__delattr__`, are not compiled per class: they are closures
over the class (its field names) that compute exactly what the generated methods compute
(`__eq__` compares as the running interpreter's `dataclass` does, for the same class only;
`__hash__` hashes the same tuple; `__repr__` writes the same text, `...` for a recursive
reference; `__setattr__` and `__delattr__` refuse a field, or any name on the class itself, with
the same `FrozenInstanceError`, and otherwise pass the call on as `super(cls, self)`). The
frozen pair comes from `dataclasses`' own hook for it, `_frozen_get_del_attr(cls, fields,
globals)` on 3.11 and 3.12, which `record` swaps for its closures only while `dataclass` makes
its class (`_FROZEN_HOOK` says whether this interpreter has that hook; from 3.13 it adds to one
compile instead, and `record` leaves it alone). A `dataclass` that another thread makes
meanwhile gets the same closures: they behave as the generated methods do.

CPython 3.13 changed how the generated `__eq__` compares: up to 3.12 it compares two tuples of
the fields, so a field holding the same object in both is equal by identity (the same `nan`
too); from 3.13 it is `self is other`, else `self.a == other.a and self.b == other.b ...`,
where the same `nan` in two instances is not equal and the result is the last comparison's own
value. `FIELD_BY_FIELD_EQ` is that one difference. A method the class body defines is kept, as
`dataclass` keeps it, and hashing follows `dataclass`'s rule: a frozen class with `eq` hashes its fields, a mutable one with
`eq` is unhashable, a class that defines `__hash__` keeps it.

Every record has a docstring of its own: `dataclass` writes a missing one from
`inspect.signature(cls)`, about 0.13 ms a class on CPython 3.11, half again a small frozen
record's cost (`tests/whole/test_layout.py` checks that each has one).

The class's `__dataclass_params__` records `eq=False, repr=False` (what `dataclass` itself was
asked for); nothing in the standard library or in mpvisor reads them.
"""

from __future__ import annotations

import dataclasses
import reprlib
import sys
from operator import attrgetter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T")
else:

    def dataclass_transform(**_: object) -> object:
        return lambda decorator: decorator


# How `dataclass` makes `__eq__` on this interpreter: field by field from CPython 3.13, as tuples before.
FIELD_BY_FIELD_EQ = sys.version_info >= (3, 13)
# `dataclass` asks `_frozen_get_del_attr(cls, fields, globals)` for a frozen class's two methods,
# compiled one by one, up to CPython 3.12; from 3.13 the hook adds them to the class's one compile.
_FROZEN_HOOK = sys.version_info < (3, 13) and hasattr(dataclasses, "_frozen_get_del_attr")
# The hook as `dataclasses` has it, put back after each swap (two threads making records at once
# then leave it as it was, whichever puts it back last).
_COMPILED_FROZEN = getattr(dataclasses, "_frozen_get_del_attr", None)


@dataclass_transform(field_specifiers=(dataclasses.field,))
def record(
    cls: type[T] | None = None,
    /,
    *,
    frozen: bool = False,
    slots: bool = False,
    init: bool = True,
    eq: bool = True,
) -> Any:
    """`@record`, `@record(frozen=True, slots=True, ...)`: as `@dataclass` with those arguments."""

    def make(cls: type[T]) -> type[T]:
        return _make(cls, frozen=frozen, slots=slots, init=init, eq=eq)

    return make if cls is None else make(cls)


def _make(cls: type[T], *, frozen: bool, slots: bool, init: bool, eq: bool) -> type[T]:
    body = dict(cls.__dict__)  # before `dataclass` (a slotted class is a new class)
    if frozen and _FROZEN_HOOK:
        dataclasses._frozen_get_del_attr = _frozen_methods  # type: ignore[attr-defined]
        try:
            made: Any = dataclasses.dataclass(cls, frozen=True, slots=slots, init=init, eq=False, repr=False)
        finally:
            dataclasses._frozen_get_del_attr = _COMPILED_FROZEN  # type: ignore[attr-defined]
    else:
        made = dataclasses.dataclass(cls, frozen=frozen, slots=slots, init=init, eq=False, repr=False)
    fields = dataclasses.fields(made)
    if "__repr__" not in body:
        _add(made, _repr([field.name for field in fields if field.repr]))
    if eq:
        if "__eq__" not in body:
            compared = [field.name for field in fields if field.compare]
            _add(made, _eq_fields(compared) if FIELD_BY_FIELD_EQ else _eq(_values(compared)))
        if not _defines_hash(body) and frozen:
            hashed = [field.name for field in fields if (field.compare if field.hash is None else field.hash)]
            _add(made, _hash(_values(hashed)))
        elif not _defines_hash(body):
            made.__hash__ = None
    made_class: type[T] = made
    return made_class


def _add(cls: type, method: Callable[..., object]) -> None:
    method.__qualname__ = f"{cls.__qualname__}.{method.__name__}"
    setattr(cls, method.__name__, method)


def _defines_hash(body: dict[str, object]) -> bool:
    """The class body sets `__hash__` itself (`dataclass`'s rule: a `__hash__ = None` that Python
    wrote because the body defines `__eq__` does not count)."""
    return "__hash__" in body and not (body["__hash__"] is None and "__eq__" in body)


def _frozen_methods(
    cls: type[Any], fields: list[dataclasses.Field[Any]], _globals: object
) -> tuple[Callable[[Any, str, object], None], Callable[[Any, str], None]]:
    """A frozen class's `__setattr__` and `__delattr__`, as `dataclass` writes them (up to 3.12):
    a field, or any name on an instance of the class itself, is refused; a subclass that is not
    a dataclass may set names of its own."""
    names = frozenset(field.name for field in fields)
    refused = dataclasses.FrozenInstanceError

    def __setattr__(self: Any, name: str, value: object) -> None:
        if type(self) is cls or name in names:
            raise refused(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise refused(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__


def _values(names: list[str]) -> Callable[[object], tuple[object, ...]]:
    """The tuple of these attributes, as `(self.a, self.b)` makes it (a tuple for one or none too)."""
    if len(names) > 1:
        return attrgetter(*names)
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda self: (one(self),)
    return lambda self: ()


def _repr(names: list[str]) -> Callable[[object], str]:
    @reprlib.recursive_repr()
    def __repr__(self: object) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__


def _eq(values: Callable[[object], tuple[object, ...]]) -> Callable[[object, object], Any]:
    def __eq__(self: object, other: object) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _eq_fields(names: list[str]) -> Callable[[object, object], Any]:
    """`self is other or (self.a == other.a and self.b == other.b ...)`, as `dataclass` writes it
    from CPython 3.13: the first false comparison's value, else the last one's."""
    getters = [attrgetter(name) for name in names]

    def __eq__(self: object, other: object) -> Any:
        if self is other:
            return True
        if other.__class__ is self.__class__:
            result: Any = True
            for get in getters:
                result = get(self) == get(other)
                if not result:
                    return result
            return result
        return NotImplemented

    return __eq__


def _hash(values: Callable[[object], tuple[object, ...]]) -> Callable[[object], int]:
    def __hash__(self: object) -> int:
        return hash(values(self))

    return __hash__
