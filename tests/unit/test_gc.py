"""The search pauses the cyclic collector and always gives it back."""

from __future__ import annotations

import gc
import threading

import pytest

from planner._gc import collector_paused


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_paused_inside_and_back_on_after():
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_back_on_after_an_exception():
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("search failed")
    assert gc.isenabled()


def test_nested_pauses_end_with_the_outermost():
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()  # the outer search is still running
    assert gc.isenabled()


def test_overlapping_searches_on_threads_restore_it_once_both_end():
    first_in, second_done = threading.Event(), threading.Event()
    seen_by_first: list[bool] = []

    def first():
        with collector_paused():
            first_in.set()
            second_done.wait(5)
            seen_by_first.append(gc.isenabled())

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    with collector_paused():  # ends before the first one does
        pass
    second_done.set()
    thread.join(5)
    assert seen_by_first == [False]  # the second search ending did not turn it back on
    assert gc.isenabled()


def test_left_off_when_it_was_off_before():
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_overlapping_searches_still_collect_when_the_pause_runs_long(monkeypatch):
    import planner._gc as pause

    collections: list[int] = []
    monkeypatch.setattr(pause, "MAX_PAUSE_S", -1.0)  # any pause is long
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(1) or 0)
    with collector_paused():
        with collector_paused():
            pass  # ends while the outer search runs, after more than MAX_PAUSE_S
        assert collections == [1]
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_short_pause_does_not_collect(monkeypatch):
    collections: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(1) or 0)
    with collector_paused(), collector_paused():
        pass
    assert collections == []


def test_plan_runs_with_the_collector_paused(monkeypatch):
    import planner.plan as planning

    seen: list[bool] = []
    monkeypatch.setattr(planning, "_plan", lambda request, store: seen.append(gc.isenabled()))
    planning.plan(None, None)  # type: ignore[arg-type]
    assert seen == [False]
    assert gc.isenabled()


def _tracked(generation: int) -> set[int]:
    return {id(o) for o in gc.get_objects(generation)}


def test_what_a_search_leaves_is_moved_to_the_oldest_generation():
    """Survivors of the pause skip the young generations (no walk over them at the next
    allocation); the count that triggers a young collection starts again from zero."""
    gc.collect()
    with collector_paused():
        kept = [[i] for i in range(20_000)]  # far past the young generation's threshold
    assert gc.get_count()[0] < gc.get_threshold()[0]
    oldest = _tracked(2)  # CPython's three generations
    assert all(id(item) in oldest for item in kept)
    assert gc.get_freeze_count() == 0  # nothing is left frozen


def test_cycles_made_in_a_pause_are_still_collected_by_a_full_collection():
    class Node:
        pass

    gc.collect()
    with collector_paused():
        first, second = Node(), Node()
        first.other, second.other = second, first  # type: ignore[attr-defined]
        del first, second
    assert gc.collect() >= 2


def test_objects_someone_else_froze_stay_frozen():
    """A server that froze its objects (before forking) keeps them frozen: the pause then
    leaves the generations as they are."""
    gc.collect()
    frozen = [[0]]
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with collector_paused():
            pass
        # Nothing was unfrozen (that would empty the permanent generation) and nothing was
        # added to it. Frozen objects may die meanwhile (other threads': pytest-xdist's
        # channel to its worker), which lowers the count: a clean-clone CI saw 3 fewer.
        assert 0 < gc.get_freeze_count() <= count
        assert not any(
            id(item) in _tracked(generation) for item in frozen for generation in (0, 1, 2)
        )
    finally:
        gc.unfreeze()
