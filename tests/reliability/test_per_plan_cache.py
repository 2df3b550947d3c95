"""The per-plan cache behind done plans' JSON and candidates' timelines: bounded by weight,
least recently used first out, a deleted plan forgets every entry of its own, and a value
computed from a plan read before a deletion is not kept after it."""

from __future__ import annotations

from api.services.cache import PerPlanCache


def test_the_least_recently_used_entry_goes_first_when_the_weight_is_exceeded():
    cache: PerPlanCache[int, bytes] = PerPlanCache(10, len)
    cache.put("a", 0, b"1234", since=cache.generation)
    cache.put("b", 0, b"1234", since=cache.generation)
    assert cache.get("a", 0) == b"1234"  # "a" is now the most recently used
    cache.put("c", 0, b"1234", since=cache.generation)  # 12 bytes > 10: "b" goes, not "a"
    assert cache.get("b", 0) is None
    assert cache.get("a", 0) == b"1234" and cache.get("c", 0) == b"1234"
    assert len(cache) == 2


def test_an_entry_heavier_than_the_capacity_is_not_kept_and_evicts_nothing():
    cache: PerPlanCache[int, bytes] = PerPlanCache(4, len)
    cache.put("a", 0, b"12", since=cache.generation)
    cache.put("b", 0, b"12345", since=cache.generation)
    assert cache.get("b", 0) is None and cache.get("a", 0) == b"12"


def test_forgetting_a_plan_drops_all_its_details_and_frees_their_weight():
    cache: PerPlanCache[int, bytes] = PerPlanCache(6, len)
    cache.put("a", 0, b"12", since=cache.generation)
    cache.put("a", 1, b"34", since=cache.generation)
    cache.put("b", 0, b"56", since=cache.generation)
    cache.forget("a")
    assert cache.get("a", 0) is None and cache.get("a", 1) is None and len(cache) == 1
    cache.put("c", 0, b"7890", since=cache.generation)  # fits only because "a"'s 4 bytes were freed
    assert cache.get("b", 0) == b"56" and cache.get("c", 0) == b"7890"


def test_the_first_value_stored_for_a_key_stays():
    cache: PerPlanCache[bool, bytes] = PerPlanCache(100, len)
    cache.put("a", True, b"first", since=cache.generation)
    cache.put("a", True, b"second", since=cache.generation)
    assert cache.get("a", True) == b"first"


def test_a_value_read_before_a_forget_is_not_kept():
    cache: PerPlanCache[int, bytes] = PerPlanCache(100, len)
    since = cache.generation  # a reader notes the generation, then reads plan "a"
    cache.forget("a")  # meanwhile "a" is deleted and forgotten
    cache.put("a", 0, b"stale", since=since)  # the reader's value comes too late
    assert cache.get("a", 0) is None
    cache.put("a", 0, b"fresh", since=cache.generation)
    assert cache.get("a", 0) == b"fresh"


def test_clearing_drops_everything_and_refuses_values_read_before():
    cache: PerPlanCache[int, bytes] = PerPlanCache(100, len)
    since = cache.generation
    cache.put("a", 0, b"12", since=since)
    cache.put("b", 0, b"34", since=since)
    cache.clear()
    assert len(cache) == 0 and cache.get("a", 0) is None
    cache.put("c", 0, b"56", since=since)
    assert cache.get("c", 0) is None
