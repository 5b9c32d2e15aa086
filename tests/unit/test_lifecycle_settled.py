"""A long-running command, once started, keeps what start-up made out of the cyclic
collector's full collections (lifecycle.settled): a full collection then walks only what was
made since, not every object of every imported module."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ravenproxy.lifecycle import settled


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()  # the rest of the test session collects as before


def test_settled_freezes_what_exists_and_collects_what_comes_later(unfrozen: None) -> None:
    class Cycle:
        other: object = None

    gc.disable()  # no automatic collection may do the work the assertions are about
    try:
        before = Cycle()
        before.other = before  # cyclic garbage of start-up: collected, not frozen
        gone_before = weakref.ref(before)
        del before
        settled()
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # this test session's modules, classes, functions
        assert gone_before() is None
        after = Cycle()
        after.other = after
        gone_after = weakref.ref(after)
        del after
        # A full collection walks only the unfrozen objects, and still finds new garbage.
        assert len(gc.get_objects(generation=2)) < frozen
        gc.collect()
        assert gone_after() is None
    finally:
        gc.enable()
