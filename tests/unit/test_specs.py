"""PlanRequest validation: what a person gets told when a request cannot be planned."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from planner.errors import StagewrightError
from planner.plan import plan
from planner.profiles import UnknownHardwareError, default_store
from planner.specs import PlanRequest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.json"))


def base_request() -> dict[str, Any]:
    """A small valid request (4 CPU ranks, a tiny GPT) that each test breaks in one place."""
    return {
        "model": {
            "name": "tiny",
            "num_layers": 4,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "ffn_hidden_size": None,
            "seq_length": 32,
            "vocab_size": 128,
        },
        "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 4},
        "training": {"global_batch_size": 8, "precision": "fp32"},
        "search": {"schedules": ["1f1b"], "recompute": ["none"], "micro_batch_sizes": [1, 2]},
    }


def with_change(section: str, field: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(base_request())
    data[section][field] = value
    return data


def errors_of(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        PlanRequest.model_validate(data)
    return str(info.value)


def test_the_base_request_is_valid():
    request = PlanRequest.model_validate(base_request())
    assert request.cluster.num_gpus == 4
    assert request.model.ffn == 4 * 64


# The schedules of the three papers and the usual ones, each with whether an update uses the
# gradients of the weights it ran with (synchronous) or of older ones (PipeDream-2BW's
# 1-stale rule): issue 12 makes every synchronous one the default search space.
SYNCHRONOUS = {
    "gpipe",
    "1f1b",
    "interleaved",
    "bpipe",
    "bpipe-interleaved",
    "v-min",
    "v-half",
    "v-zb",
    "v-adaptive",
    "zb-adaptive",
    "1f1b-v",
}
STALE = {"2bw"}


@pytest.mark.parametrize("stale", [False, True])
def test_a_request_without_schedules_searches_every_synchronous_one(stale):
    """Omitted, ``search.schedules`` is every synchronous schedule (not ``["1f1b"]``), and
    2BW only when the request allows stale weights; a plan of it looks at all of them."""
    data = copy.deepcopy(base_request())
    del data["search"]["schedules"]
    data["search"]["allow_stale_weights"] = stale
    request = PlanRequest.model_validate(data)
    assert set(request.search.schedules) == SYNCHRONOUS | (STALE if stale else set())
    by_schedule = {entry.schedule for entry in plan(request).by_schedule}
    assert by_schedule == set(request.search.schedules)


def test_hidden_not_divisible_by_heads_names_both_numbers():
    message = errors_of(with_change("model", "hidden_size", 66))
    assert "hidden_size 66 is not divisible by num_attention_heads 4" in message


@pytest.mark.parametrize("field", ["num_nodes", "gpus_per_node"])
def test_a_cluster_without_gpus_is_refused_naming_the_field(field):
    message = errors_of(with_change("cluster", field, 0))
    assert f"cluster.{field}" in message
    assert "greater than or equal to 1" in message


def test_a_batch_that_no_micro_batch_and_data_degree_divide_is_refused():
    # 7 is odd: 2 x d and 4 x d are even for every data-parallel degree d in {1, 2, 4, 8}.
    data = with_change("training", "global_batch_size", 7)
    data["cluster"]["gpus_per_node"] = 8
    data["search"]["micro_batch_sizes"] = [2, 4]
    assert all(7 % (mb * d) for mb in (2, 4) for d in (1, 2, 4, 8))
    message = errors_of(data)
    assert "global_batch_size 7" in message
    assert "[2, 4]" in message


def test_a_batch_that_one_micro_batch_size_divides_is_accepted():
    # 6 = 2 x 3 x 1: mb 2 with d 1 works even though 4 never does.
    data = with_change("training", "global_batch_size", 6)
    data["search"]["micro_batch_sizes"] = [2, 4]
    assert PlanRequest.model_validate(data).training.global_batch_size == 6


@pytest.mark.parametrize(
    "field, value",
    [
        ("schedules", ["1f1b", "bpipe", "1f1b"]),
        ("recompute", ["none", "full", "none"]),
    ],
)
def test_duplicated_entries_are_refused(field, value):
    message = errors_of(with_change("search", field, value))
    assert f"search.{field}" in message
    assert "twice" in message


@pytest.mark.parametrize("field", ["schedules", "recompute"])
def test_empty_schedule_or_recompute_lists_are_refused(field):
    message = errors_of(with_change("search", field, []))
    assert f"search.{field}" in message


@pytest.mark.parametrize(
    "sizes, expected",
    [
        ([], "micro_batch_sizes is empty"),
        ([0, 2], "must be positive"),
        ([-1], "must be positive"),
        ([2, 2], "lists a size twice"),
    ],
)
def test_bad_micro_batch_sizes_are_refused(sizes, expected):
    message = errors_of(with_change("search", "micro_batch_sizes", sizes))
    assert expected in message


def test_micro_batch_sizes_are_kept_sorted():
    request = PlanRequest.model_validate(with_change("search", "micro_batch_sizes", [4, 1, 2]))
    assert request.search.micro_batch_sizes == [1, 2, 4]


@pytest.mark.parametrize("section", ["model", "cluster", "training", "search"])
def test_an_unknown_field_in_any_section_is_refused(section):
    data = with_change(section, "typo_field", 1)
    message = errors_of(data)
    assert f"{section}.typo_field" in message
    assert "Extra inputs are not permitted" in message


def test_an_unknown_top_level_field_is_refused():
    data = base_request()
    data["comment"] = "hello"
    assert "Extra inputs are not permitted" in errors_of(data)


@pytest.mark.parametrize(
    "section, field, value, allowed",
    [
        ("search", "schedules", ["1f1b", "zb-h2"], "'v-half'"),
        ("training", "precision", "fp8", "'bf16'"),
        ("search", "recompute", ["partial"], "'selective'"),
        ("search", "method", "annealing", "'cpsat'"),
        ("training", "optimizer", "lion", "'sgd'"),
    ],
)
def test_unknown_enumeration_values_list_the_allowed_ones(section, field, value, allowed):
    message = errors_of(with_change(section, field, value))
    assert f"{section}.{field}" in message
    assert allowed in message


def test_an_unknown_gpu_lists_the_known_profiles():
    request = PlanRequest.model_validate(with_change("cluster", "gpu", "tpu-v9"))
    with pytest.raises(UnknownHardwareError) as info:
        plan(request)
    message = str(info.value)
    assert "'tpu-v9'" in message
    known = default_store().hardware_names()
    assert {"a100-sxm-80g", "cpu", "v100-16g"} <= set(known)
    for name in known:
        assert name in message


def test_the_store_refuses_an_unknown_gpu_the_same_way():
    with pytest.raises(UnknownHardwareError, match="known hardware profiles: .*a100-sxm-80g"):
        default_store().hardware("nope")
    assert issubclass(UnknownHardwareError, StagewrightError)


def test_bf16_on_a_v100_names_the_supported_precisions():
    data = with_change("cluster", "gpu", "v100-16g")
    data["training"]["precision"] = "bf16"
    request = PlanRequest.model_validate(data)
    with pytest.raises(StagewrightError) as info:
        plan(request)
    message = str(info.value)
    assert "v100-16g" in message and "bf16" in message
    assert "fp16" in message and "fp32" in message


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_parses(path):
    request = PlanRequest.model_validate_json(path.read_text())
    assert request.cluster.num_gpus >= 1
    assert request.training.global_batch_size >= 1


def test_there_are_examples():
    names = {p.name for p in EXAMPLES}
    assert {"tiny-cpu.json", "gpt3-96b-32xa100.json", "gpt3-13b-8xa100.json"} <= names


# The contract document is kept beside the repository, not in it (the repository's own
# ARCHITECTURE.md describes the code's layout and holds no contracts).
CONTRACTS = REPO.parent / "shared" / "ARCHITECTURE.md"


def test_the_contract_example_request_parses():
    if not CONTRACTS.is_file():
        pytest.skip("the contract document (shared/ARCHITECTURE.md) is not beside this checkout")
    text = CONTRACTS.read_text()
    start = text.index("PlanRequest (same JSON")
    block = re.search(r"```json\n(.*?)```", text[start:], re.DOTALL)
    assert block is not None, "the PlanRequest section has no json block"
    data = json.loads(block.group(1))
    request = PlanRequest.model_validate(data)
    assert request.model.name == "gpt3-96b"
    assert request.cluster.num_gpus == 32
    assert request.search.schedules == ["1f1b", "bpipe"]


def test_every_hardware_profile_field_round_trips_through_its_dict():
    """What a plan's profile snapshot stores is the whole profile: hardware_to_dict writes
    every field, and hardware_from_dict reads back an equal profile."""
    import dataclasses

    from planner.profiles import default_store, hardware_from_dict, hardware_to_dict

    store = default_store()
    for name in store.hardware_names():
        profile = store.hardware(name)
        written = hardware_to_dict(profile)
        assert set(written) == {f.name for f in dataclasses.fields(profile)}
        assert hardware_from_dict(written) == profile
