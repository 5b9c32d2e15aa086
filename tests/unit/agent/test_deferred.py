"""The stand-ins an agent puts in place of a deferred module's functions
(:data:`ravenproxy.agent.deferred.STAND_INS`) answer as the module's own: each is compared with
the real function (loaded in this process) over the kinds of objects it may be given."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ravenproxy.agent.deferred import STAND_INS


def plain(x: int) -> int:
    return x


async def coroutine_function() -> None:
    pass


def generator_function() -> Iterator[int]:
    yield 1


class Thing:
    def method(self) -> None:
        pass

    async def async_method(self) -> None:
        pass

    def __call__(self) -> None:
        pass

    @staticmethod
    async def static_async() -> None:
        pass


@functools.wraps(plain)
def wrapper(x: int) -> int:
    return plain(x)


@functools.wraps(coroutine_function)
async def async_wrapper() -> None:
    await coroutine_function()


def looped() -> None:
    pass


looped.__wrapped__ = looped  # type: ignore[attr-defined]


class Annotated:
    count: int
    name: str = "x"


class Inheriting(Annotated):
    pass


@dataclasses.dataclass
class Data(Annotated):
    extra: list[int]


class Foreign:
    pass


Foreign.__annotations__ = (1, 2)  # type: ignore[assignment]  # inspect's ValueError


thing = Thing()
generator = generator_function()
coroutine = coroutine_function()
coroutine.close()  # only looked at
OBJECTS: list[Any] = [
    plain,
    coroutine_function,
    generator_function,
    generator,
    coroutine,
    Thing,
    thing,
    thing.method,
    thing.async_method,
    Thing.static_async,
    Thing.async_method,
    functools.partial(plain, 1),
    functools.partial(coroutine_function),
    functools.partial(functools.partial(thing.async_method)),
    functools.partial(thing.async_method),  # a method in a partial: inspect's own answer
    lambda: None,
    print,
    len,
    asyncio.Event().set,
    [].append,
    wrapper,
    async_wrapper,
    Annotated,
    Inheriting,
    Data,
    Foreign,
    int,
    type,
    asyncio,
    types.ModuleType("bare"),
    None,
    1,
    "text",
]


def outcome(function: Callable[[Any], Any], obj: Any) -> tuple[str, Any]:
    """What ``function(obj)`` returns, or the type of what it raises."""
    try:
        return "returns", function(obj)
    except Exception as exc:  # the error is the answer compared
        return "raises", type(exc)


@pytest.mark.parametrize("name", sorted(STAND_INS["inspect"]))
def test_each_inspect_stand_in_answers_as_inspect(name: str) -> None:
    stand_in: Callable[[Any], Any] = STAND_INS["inspect"][name]
    real = getattr(inspect, name)
    for obj in OBJECTS:
        (kind, got), (real_kind, want) = outcome(stand_in, obj), outcome(real, obj)
        assert kind == real_kind and (got is want or got == want), (name, obj, got, want)


def test_get_annotations_answers_a_copy_as_inspect() -> None:
    get_annotations = STAND_INS["inspect"]["get_annotations"]
    got = get_annotations(Annotated)
    assert got == {"count": "int", "name": "str"} and got is not Annotated.__annotations__
    assert get_annotations(Data, eval_str=True) == inspect.get_annotations(Data, eval_str=True)


def test_unwrap_stops_where_inspect_does_and_finds_the_same_loop() -> None:
    unwrap = STAND_INS["inspect"]["unwrap"]
    assert unwrap(wrapper, stop=lambda f: f is wrapper) is wrapper
    with pytest.raises(ValueError, match="wrapper loop"):
        unwrap(looped)
