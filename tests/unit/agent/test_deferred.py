"""The stand-ins an agent puts in place of a deferred module's names
(:data:`ravenproxy.agent.deferred.STAND_INS`) answer as the module's own: each is compared with
the real one (loaded in this process) over the kinds of objects it may be given, and uvloop and
asyncio, given them at their import in an agent's process, work as with the real ones."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import subprocess
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ravenproxy.agent.deferred import STAND_INS

ROOT = Path(__file__).resolve().parents[3]


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


# -- traceback: read by asyncio's C module and uvloop at their import, used in debug mode ---------
def test_extract_stack_answers_as_traceback_from_the_callers_frame() -> None:
    extract_stack = STAND_INS["traceback"]["extract_stack"]
    got, want = extract_stack(), traceback.extract_stack()  # one line: the same line numbers
    assert got == want and len(got) > 3
    here = sys._getframe()
    assert extract_stack(here, 2) == traceback.extract_stack(here, 2)
    assert extract_stack(limit=1) == traceback.extract_stack(limit=1)


def test_walk_stack_answers_as_traceback_from_whoever_iterates_it() -> None:
    walk_stack = STAND_INS["traceback"]["walk_stack"]
    here = sys._getframe()
    assert list(walk_stack(here)) == list(traceback.walk_stack(here))
    got, want = list(walk_stack(None)), list(traceback.walk_stack(None))
    assert got == want and got


def test_stack_summary_extract_and_format_list_answer_as_traceback() -> None:
    stand_ins = STAND_INS["traceback"]
    here = sys._getframe()
    extracts = (stand_ins["StackSummary"].extract, traceback.StackSummary.extract)
    for limit, lookup in ((None, True), (3, False), (0, True)):
        # Both walk this frame from the same line (its line number is read as it is walked).
        got, want = (
            e(traceback.walk_stack(here), limit=limit, lookup_lines=lookup) for e in extracts
        )
        assert type(got) is traceback.StackSummary and got == want
        assert stand_ins["format_list"](got) == traceback.format_list(want)


# -- subprocess: its constants and uvloop's SubprocessError -------------------------------------
def test_subprocess_constants_are_its_own() -> None:
    stand_ins = STAND_INS["subprocess"]
    for name in ("PIPE", "STDOUT", "DEVNULL"):
        assert stand_ins[name] == getattr(subprocess, name), name


def test_subprocess_error_made_by_the_stand_in_is_a_real_one() -> None:
    error = STAND_INS["subprocess"]["SubprocessError"]("Exception occurred in preexec_fn.")
    assert type(error) is subprocess.SubprocessError
    assert error.args == ("Exception occurred in preexec_fn.",)
    with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):
        raise error


# In an agent's process (its modules deferred first, as ravenproxy.__main__ does): uvloop and
# asyncio's C module got the stand-ins at their import. A child started through uvloop loads
# neither module; debug mode's source tracebacks and a failing preexec_fn (uvloop's
# SubprocessError) come out as without the stand-ins.
AGENT_PROCESS = """
import sys
if sys.argv[1] == "deferred":
    from ravenproxy.agent.deferred import defer_unused
    defer_unused()
import asyncio, json, subprocess, traceback, uvloop

def fail():
    raise ValueError("no")

async def main():
    loop = asyncio.get_running_loop()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "print(6 * 7)", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await proc.communicate()
    loaded = [type(sys.modules[n]).__name__ for n in ("traceback", "subprocess")]
    loop.set_debug(True)  # a traceback for each future and callback: traceback loads
    future = loop.create_future()
    handle = loop.call_soon(lambda: None)
    names = [
        [frame.name for frame in future._source_traceback][-2:],
        [frame.name for frame in handle._source_traceback][-2:],
    ]
    future.cancel()
    try:
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass", preexec_fn=fail)
    except subprocess.SubprocessError as exc:
        error = [type(exc).__module__, str(exc), repr(exc.__cause__)]
    return {"names": names, "out": out.decode(), "loaded": loaded, "error": error}

print(json.dumps(uvloop.run(main())))
"""


def agent_process(mode: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", AGENT_PROCESS, mode],
        cwd=ROOT, capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_uvloop_debug_tracebacks_and_children_in_an_agents_process() -> None:
    deferred, plain = agent_process("deferred"), agent_process("plain")
    # Deferred, a child started through uvloop needs neither module's code.
    assert deferred.pop("loaded") == ["LazyModule", "LazyModule"]
    assert plain.pop("loaded") == ["module", "module"]
    assert deferred == plain
    assert plain["names"][0][-1] == "main" and plain["out"] == "42\n"
    assert plain["error"] == ["subprocess", "Exception occurred in preexec_fn.", "ValueError('no')"]
