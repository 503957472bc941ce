"""`record` makes the class `dataclass` makes: the same equality, hash, text, frozenness and
dataclass machinery, for every combination of the arguments mpvisor uses."""

from __future__ import annotations

import ast
import copy
import dataclasses
import math
import pathlib
import pickle
from dataclasses import FrozenInstanceError, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpvisor._model import records
from mpvisor._model.records import record

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAN = math.nan  # one object: (nan,) == (nan,) holds by identity, nan == nan does not


class Verdict:
    """A value whose `==` answers with an object of its own, not a bool (as an array's does):
    up to CPython 3.12 a dataclass's `__eq__` (a tuple comparison) makes it a bool; from 3.13
    (field by field) it is returned as it is."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    def __eq__(self, other: object) -> Any:
        return self.answer

    def __hash__(self) -> int:
        return hash(self.answer)

    def __repr__(self) -> str:
        return f"Verdict({self.answer!r})"


values = st.one_of(
    st.integers(-3, 3),
    st.sampled_from(["", "a", "b"]),
    st.none(),
    st.just(NAN),
    st.just(0.0),
    st.just(False),
    st.tuples(st.integers(0, 2), st.sampled_from(["x", "y"])),
    st.sampled_from([Verdict("yes"), Verdict("")]),
)
field_flags = st.fixed_dictionaries({"compare": st.booleans(), "hash": st.sampled_from([None, True, False]), "repr": st.booleans()})


@st.composite
def shapes(draw: st.DrawFn) -> dict[str, Any]:
    flags = draw(st.lists(field_flags, max_size=4))
    return {
        "frozen": draw(st.booleans()),
        "slots": draw(st.booleans()),
        "eq": draw(st.booleans()),
        "fields": flags,
    }


def build(decorator: Any, shape: dict[str, Any]) -> type:
    """The same class body, made by `dataclass` or by `record`."""
    annotations = {f"f{i}": "object" for i in range(len(shape["fields"]))}
    body: dict[str, Any] = {"__annotations__": annotations, "__module__": __name__, "__qualname__": "Shape"}
    for i, flags in enumerate(shape["fields"]):
        body[f"f{i}"] = field(**flags)
    cls = type("Shape", (), body)
    return decorator(frozen=shape["frozen"], slots=shape["slots"], eq=shape["eq"])(cls)  # type: ignore[no-any-return]


def hashed(instance: object) -> tuple[str, object]:
    try:
        return ("hash", hash(instance))
    except TypeError as exc:
        return ("unhashable", str(exc).replace("Shape", "X"))


@settings(max_examples=300, deadline=None)
@given(shapes(), st.data())
def test_record_behaves_as_dataclass(shape: dict[str, Any], data: st.DataObject) -> None:
    """Same fields, repr, ==, !=, hash, unhashability, frozenness and replace, value for value,
    as this interpreter's `dataclass` makes them."""
    made, reference = build(record, shape), build(dataclasses.dataclass, shape)
    assert [(f.name, f.compare, f.hash, f.repr) for f in dataclasses.fields(made)] == [
        (f.name, f.compare, f.hash, f.repr) for f in dataclasses.fields(reference)
    ]
    assert made.__match_args__ == reference.__match_args__  # type: ignore[attr-defined]
    n = len(shape["fields"])
    rows = data.draw(st.lists(st.lists(values, min_size=n, max_size=n), min_size=2, max_size=4))
    ours = [made(*row) for row in rows]
    theirs = [reference(*row) for row in rows]
    for a, ra in zip(ours, theirs, strict=True):
        assert repr(a) == repr(ra)
        assert hashed(a)[0] == hashed(ra)[0]
        if hashed(a)[0] == "hash" and shape["eq"]:
            assert hashed(a) == hashed(ra)
        for b, rb in zip(ours, theirs, strict=True):
            same, reference_same = a == b, ra == rb
            assert (same, type(same)) == (reference_same, type(reference_same))
            assert (a != b) == (ra != rb)
        assert (a == object()) is False and (a == ra) is False  # another class is never equal
        if shape["frozen"] and n:
            with pytest.raises(FrozenInstanceError):
                a.f0 = 1  # type: ignore[attr-defined]
        if n:  # `copy.replace` (CPython 3.13 and later, through `__replace__`) where there is one
            replace = getattr(copy, "replace", dataclasses.replace)
            changed = replace(a, f0="changed")
            assert repr(changed) == repr(replace(ra, f0="changed")) and type(changed) is made
        assert repr(dataclasses.asdict(a)) == repr(dataclasses.asdict(ra))


@record(frozen=True, slots=True)
class Frozen:
    name: str
    sizes: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list, compare=False)


@record
class Mutable:
    name: str
    children: list[Mutable] = field(default_factory=list)


@record(frozen=True)
class OwnMethods:
    key: str
    weight: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OwnMethods) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"<{self.key}>"


@record(eq=False, slots=True)
class Identity:
    name: str


def test_a_frozen_slotted_record_pickles_copies_and_keeps_its_slots() -> None:
    value = Frozen("a", (1, 2), ["note"])
    assert pickle.loads(pickle.dumps(value)) == value
    assert copy.deepcopy(value) == value and copy.copy(value) == value
    assert not hasattr(value, "__dict__") and Frozen.__slots__ == ("name", "sizes", "notes")
    assert value == Frozen("a", (1, 2), ["other notes"])  # compare=False
    assert hash(value) == hash(("a", (1, 2)))
    assert repr(value) == "Frozen(name='a', sizes=(1, 2), notes=['note'])"
    assert Frozen.__repr__.__qualname__ == "Frozen.__repr__"
    with pytest.raises(FrozenInstanceError):
        value.name = "b"  # type: ignore[misc]


def frozen_answers(cls: type) -> list[str]:
    """What setting and deleting a field and another name does, on an instance of the class and
    of a plain subclass: the error's type and text, or what was set."""

    class Plain(cls):  # type: ignore[valid-type, misc]
        pass

    answers = []
    for instance in (cls("a", (1,)), Plain("a", (1,))):
        for act, args in ((setattr, ("name", "b")), (setattr, ("other", 1)), (delattr, ("name",)), (delattr, ("other",))):
            try:
                act(instance, *args)
                answers.append(f"ok {getattr(instance, 'other', None)}")
            except Exception as error:  # the answer is what is compared
                answers.append(f"{type(error).__name__}: {error}")
    return answers


def test_a_frozen_record_refuses_and_passes_on_as_dataclass_does() -> None:
    """The frozen `__setattr__`/`__delattr__` (closures up to CPython 3.12, not compiled) answer
    as `dataclass`'s: a field or any name of the class's own instance refused with the same
    words, a plain subclass's own names set and deleted; and `dataclass` keeps its own hook."""
    hook = getattr(dataclasses, "_frozen_get_del_attr", None)

    @record(frozen=True)
    class Ours:
        name: str
        sizes: tuple[int, ...] = ()

    @dataclasses.dataclass(frozen=True)
    class Theirs:
        name: str
        sizes: tuple[int, ...] = ()

    assert getattr(dataclasses, "_frozen_get_del_attr", None) is hook
    assert frozen_answers(Ours) == frozen_answers(Theirs)
    assert "FrozenInstanceError: cannot assign to field 'other'" in frozen_answers(Ours)
    assert "ok 1" in frozen_answers(Ours)  # the subclass set a name of its own
    made_by = Ours.__setattr__.__code__.co_filename
    assert (made_by == records.__file__) is records._FROZEN_HOOK  # a closure, not a compile, up to 3.12
    assert Ours.__setattr__.__qualname__ == "test_a_frozen_record_refuses_and_passes_on_as_dataclass_does.<locals>.Ours.__setattr__"


def test_a_mutable_record_is_unhashable_and_its_repr_survives_a_cycle() -> None:
    parent = Mutable("p")
    parent.children.append(parent)
    assert repr(parent) == "Mutable(name='p', children=[...])"
    with pytest.raises(TypeError, match="unhashable"):
        hash(parent)
    parent.name = "q"
    assert parent == Mutable("q", [parent])


def test_methods_the_class_defines_are_kept_and_eq_false_is_identity() -> None:
    assert OwnMethods("k", 1) == OwnMethods("k", 2)
    assert hash(OwnMethods("k", 1)) == hash("k")
    assert repr(OwnMethods("k", 1)) == "<k>"
    one = Identity("a")
    assert one != Identity("a") and one == one
    assert hash(one) == object.__hash__(one)
    assert repr(one) == "Identity(name='a')"


def test_mpvisor_defines_its_dataclasses_with_record() -> None:
    """One mechanism: a class decorated with `dataclass` directly would pay its compiles again."""
    direct = []
    for path in sorted((ROOT / "mpvisor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for decorator in node.decorator_list:
                    target = decorator.func if isinstance(decorator, ast.Call) else decorator
                    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                    if name == "dataclass":
                        direct.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert direct == []
