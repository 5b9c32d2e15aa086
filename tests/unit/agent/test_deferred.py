"""The stand-ins an agent puts in place of a deferred module's functions
(:data:`ravenproxy.agent.deferred.STAND_INS`) answer as the module's own: each is compared with
the real function (loaded in this process) over the kinds of objects it may be given."""

from __future__ import annotations

import asyncio
import functools
import inspect
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
    None,
    1,
    "text",
]


@pytest.mark.parametrize("name", sorted(STAND_INS["inspect"]))
def test_each_inspect_stand_in_answers_as_inspect(name: str) -> None:
    stand_in: Callable[[Any], Any] = STAND_INS["inspect"][name]
    real = getattr(inspect, name)
    for obj in OBJECTS:
        assert stand_in(obj) is real(obj) or stand_in(obj) == real(obj), (name, obj)


def test_unwrap_stops_where_inspect_does_and_finds_the_same_loop() -> None:
    unwrap = STAND_INS["inspect"]["unwrap"]
    assert unwrap(wrapper, stop=lambda f: f is wrapper) is wrapper
    with pytest.raises(ValueError, match="wrapper loop"):
        unwrap(looped)
