"""`tuples.NamedTuple` makes the class `typing.NamedTuple` makes, from the same class statement:
the same fields, defaults, text, equality, methods, pattern matching, pickling and refusals."""

from __future__ import annotations

import copy
import pickle
import typing
from typing import Any, Generic, TypeVar

import pytest

from mpvisor._model.tuples import NamedTuple

pytestmark = pytest.mark.unit

T = TypeVar("T")


def both(body: str) -> tuple[Any, Any]:
    """The class `body` (a class statement naming `NT` as its base) made by each."""
    made = []
    for base in (NamedTuple, typing.NamedTuple):
        namespace: dict[str, Any] = {"NT": base, "Generic": Generic, "T": T, "__name__": __name__}
        exec("from __future__ import annotations\n" + body, namespace)
        made.append(namespace["Made"])
    return made[0], made[1]


MADE = '''
class Made(NT):
    """A message."""

    key: int
    how: str
    oom: bool = False
    used: float = 0.0

    def twice(self) -> int:
        return self.key * 2

    @property
    def ended(self) -> str:
        return f"{self.how}:{self.key}"
'''


def test_the_same_class_as_typing_makes():
    ours, theirs = both(MADE)
    assert ours._fields == theirs._fields == ("key", "how", "oom", "used")
    assert ours._field_defaults == theirs._field_defaults == {"oom": False, "used": 0.0}
    assert ours.__match_args__ == theirs.__match_args__
    assert ours.__doc__ == theirs.__doc__ == "A message."
    assert ours.__bases__ == theirs.__bases__ == (tuple,)
    assert (ours.__module__, ours.__qualname__) == (theirs.__module__, theirs.__qualname__)
    assert ours.__annotations__ == {"key": "int", "how": "str", "oom": "bool", "used": "float"}  # not evaluated
    a, b = ours(1, "exit"), theirs(1, "exit")
    assert repr(a) == repr(b) == "Made(key=1, how='exit', oom=False, used=0.0)"
    assert a == (1, "exit", False, 0.0) == b and hash(a) == hash(b)
    assert a.twice() == 2 and a.ended == "exit:1"
    assert a._replace(oom=True) == (1, "exit", True, 0.0)
    assert a._asdict() == b._asdict()
    assert ours._make([2, "signal", True, 1.5]) == theirs._make([2, "signal", True, 1.5])
    assert ours(key=3, how="exit", used=2.0) == theirs(key=3, how="exit", used=2.0)
    assert copy.deepcopy(a) == a
    match a:
        case ours(key=1, how=how):
            assert how == "exit"
        case _:
            pytest.fail("no match")


class Pickled(NamedTuple):
    """Defined at module level, so that pickle finds it by name."""

    name: str
    sizes: tuple[int, ...] = ()


def test_a_named_tuple_pickles_by_its_name():
    value = Pickled("a", (1, 2))
    assert pickle.loads(pickle.dumps(value)) == value and type(pickle.loads(pickle.dumps(value))) is Pickled


@pytest.mark.parametrize(("body", "error"), [
    ("class Made(NT):\n    a: int = 1\n    b: str\n", TypeError),
    ("class Made(NT):\n    a: int\n    def _replace(self): pass\n", AttributeError),
    ("class Made(NT):\n    a: int\n    __slots__ = ('a',)\n", AttributeError),
    ("class Made(NT, dict):\n    a: int\n", TypeError),
])
def test_what_typing_refuses_is_refused_alike(body: str, error: type[Exception]):
    answers = []
    for base in (NamedTuple, typing.NamedTuple):
        with pytest.raises(error) as raised:
            exec("from __future__ import annotations\n" + body, {"NT": base, "__name__": __name__})
        answers.append(str(raised.value))
    assert answers[0] == answers[1]


def test_a_generic_named_tuple_takes_its_type_parameters():
    ours, theirs = both("class Made(NT, Generic[T]):\n    item: T\n    weight: int = 1\n")
    assert ours.__parameters__ == theirs.__parameters__ == (T,)
    assert repr(ours[int]).endswith("Made[int]") and repr(theirs[int]).endswith("Made[int]")
    assert ours("x") == theirs("x") == ("x", 1)
