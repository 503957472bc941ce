"""`NamedTuple`: `typing.NamedTuple` at a fraction of the start-up cost, and without `typing`.

Write a named tuple as `typing.NamedTuple` is written (`class Exited(NamedTuple):`, one
annotated field a line, defaults last, methods and a docstring in the body, `Generic[T]` beside
it); a type checker sees `typing.NamedTuple` itself. What runs is a `collections.namedtuple`
with the same fields, defaults, module and qualified name, given the body's other names (its
methods, its docstring), as `typing.NamedTuple` makes it. Two things are left out, both costly
as a module is imported: the fields' types are not evaluated (`__annotations__` keeps them as
written: strings, since every module of the package imports `annotations` from `__future__`;
`typing.NamedTuple` compiles each such string into a `ForwardRef`, about a fifth of a million
instructions a field), and `typing` itself, with `re` that it imports, is not imported: the fork
server's imports, which every launcher's start-up waits for, took a fifth more instructions
with them (it imports `typing` later, for its attempts, once it has nothing to do). A body that
`typing.NamedTuple` refuses (a field without a default after one with a default, a name such
as `_replace` or `__new__` that the tuple owns, another base than `NamedTuple` and `Generic`) is
refused alike.
"""

from __future__ import annotations

import collections
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:
    # Names a class body may not set (the tuple's own), and names it sets that are not copied.
    _OWNED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults", "_make",
                        "_replace", "_asdict", "_source"})
    _NOT_COPIED = frozenset({"__module__", "__name__", "__annotations__"})

    class _Maker(type):
        """The metaclass of `NamedTuple`: a class statement that names it as a base makes a
        `collections.namedtuple` instead of a subclass."""

        def __new__(cls, name: str, bases: tuple[type, ...], body: dict[str, object]) -> type:
            if not bases:  # `NamedTuple` itself
                return super().__new__(cls, name, bases, body)
            generic = _generic(bases)
            annotations = dict(body.get("__annotations__", {}))  # type: ignore[call-overload]
            fields = list(annotations)
            defaulted: list[str] = []
            for field in fields:
                if field in body:
                    defaulted.append(field)
                elif defaulted:
                    raise TypeError(f"Non-default namedtuple field {field} cannot follow default field"
                                    f"{'s' if len(defaulted) > 1 else ''} {', '.join(defaulted)}")
            made = collections.namedtuple(name, fields, defaults=[body[field] for field in defaulted],
                                          module=str(body["__module__"]))
            for key, value in body.items():
                if key in _OWNED:
                    raise AttributeError("Cannot overwrite NamedTuple attribute " + key)
                if key not in _NOT_COPIED and key not in fields:
                    setattr(made, key, value)
            made.__annotations__ = annotations
            if generic is not None:  # `Made[int]` as for `typing.NamedTuple`'s: its type variables, in order
                made.__parameters__ = tuple(parameter for base in body.get("__orig_bases__", ())  # type: ignore[attr-defined]
                                            if getattr(base, "__origin__", None) is generic for parameter in base.__args__)
                made.__class_getitem__ = classmethod(_generic_getitem(generic))
            return made

    def _generic_getitem(generic: type) -> object:
        """The function behind `Generic[...]`, as `typing.NamedTuple` gives a generic tuple its
        `__class_getitem__`: `Generic.__class_getitem__`'s own on CPython 3.11; from 3.12, where
        `Generic` is C code, the function of `typing`'s that it calls."""
        function = getattr(generic.__class_getitem__, "__func__", None)  # type: ignore[attr-defined]
        return function if function is not None else sys.modules[generic.__module__]._generic_class_getitem  # type: ignore[attr-defined]

    def _generic(bases: tuple[type, ...]) -> type | None:
        """`typing.Generic` if it is among `bases` (beside `NamedTuple`), else None; any other
        base is refused, as `typing.NamedTuple` refuses it."""
        found = None
        for base in bases:
            if base is NamedTuple:
                continue
            if base.__module__ == "typing" and base.__name__ == "Generic":
                found = base
                continue
            raise TypeError("can only inherit from a NamedTuple type and Generic")
        return found

    NamedTuple = _Maker("NamedTuple", (), {"__module__": __name__, "__doc__": __doc__})
