"""A candidate's timeline: generated on demand, bounded, cached, priced as the plan was.

The timeline is simulated from the profiles the plan was priced with (its snapshot, not
today's profiles), drawn action by action only when the schedule is small enough
(``max_timeline_actions``), else summarised per device; a request can ask for a time window
and a number of actions, and gets at most ``limit`` of them with where to continue. The
result is kept per (plan, candidate) in a bounded in-process cache: a plan never changes
once done, so a second look costs nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from api import problems
from api.services.plans import load_done_plan, ranked_candidate
from api.store.snapshots import find_snapshot
from planner.errors import StagewrightError
from planner.profiles import ProfileStore
from planner.search.timeline import candidate_timeline, memory_breakdown
from planner.specs import STORED, CandidateConfig, PlanRequest

if TYPE_CHECKING:
    from api.state import AppState

__all__ = [
    "TimelineWindow",
    "plan_timeline",
    "plan_timeline_json",
    "rejected_memory_json",
    "timeline_weight",
]


def timeline_weight(timeline: dict[str, Any]) -> int:
    """A cached timeline's weight: its actions (and one for the summary itself)."""
    return 1 + sum(len(d.get("actions", ())) for d in timeline["devices"])


@dataclass(frozen=True)
class TimelineWindow:
    """Which part of an action timeline to answer: actions overlapping [start_s, end_s],
    at most ``limit`` of them (earliest first)."""

    start_s: float = 0.0
    end_s: float | None = None
    limit: int = 20_000


def plan_timeline(
    state: AppState, plan_id: str, candidate: int, window: TimelineWindow
) -> dict[str, Any]:
    """The timeline of candidate ``candidate`` (0 = best) of a done plan, windowed (the
    actions only: each device's stages, memory and memory curve come whole)."""
    timeline = state.cached(state.timelines, plan_id, candidate)
    if timeline is None:  # (a plan deleted meanwhile: _compute answers 404)
        since = state.timelines.generation
        timeline = _compute(state, plan_id, candidate)
        state.timelines.put(plan_id, candidate, timeline, since=since)
    return _windowed(timeline, window)


def plan_timeline_json(
    state: AppState, plan_id: str, candidate: int, window: TimelineWindow
) -> bytes:
    """:func:`plan_timeline` as JSON bytes (encoded on this thread, not the event loop)."""
    return json.dumps(plan_timeline(state, plan_id, candidate, window)).encode()


def _compute(state: AppState, plan_id: str, candidate: int) -> dict[str, Any]:
    with state.database.session() as session:
        record = load_done_plan(session, plan_id, "ask for its timeline")
        chosen = ranked_candidate(record, candidate)
        store, profiles = _priced_with(session, record.id, record.gpu, record.hardware_revision)
        stored = record.result["request"]  # type: ignore[index]
        request = PlanRequest.model_validate(stored, context={STORED: True})
        config = CandidateConfig.model_validate(chosen["config"])
    timeline = candidate_timeline(
        request, config, store, max_work=state.settings.max_timeline_actions
    )
    timeline["profiles"] = profiles
    return timeline


def rejected_memory_json(state: AppState, plan_id: str, index: int) -> bytes:
    """Rejected configuration ``index`` (its place in the plan's rejected list) with each
    pipeline device's memory as the plan counted it (``memory``: parameters, gradients,
    optimizer, activations, allowance, total GiB), priced with the plan's own profiles; a
    404 naming the range for a bad index, a 409 for a configuration rejected before it was
    priced (a broken constraint has no memory figure)."""
    with state.database.session() as session:
        record = load_done_plan(session, plan_id, "inspect its rejected configurations")
        rejected = (record.result or {}).get("rejected") or []
        if index >= len(rejected):
            raise problems.not_found(
                "rejected-not-found",
                "Rejected configuration not found",
                f"plan {record.id} has {len(rejected)} rejected configurations; ask for "
                f"0..{max(0, len(rejected) - 1)}",
            )
        entry = rejected[index]
        store, profiles = _priced_with(session, record.id, record.gpu, record.hardware_revision)
        stored = record.result["request"]  # type: ignore[index]
        request = PlanRequest.model_validate(stored, context={STORED: True})
    if entry.get("predicted") is None:
        raise problems.ApiProblem(
            409,
            "not-priced",
            f"rejected configuration {index} was refused before pricing ({entry['reason']}); "
            "it has no memory figure",
            title="Configuration not priced",
        )
    config = CandidateConfig.model_validate(entry["config"])
    try:
        memory = memory_breakdown(request, config, store)
    except StagewrightError as exc:
        raise problems.ApiProblem(
            409, "not-priced", f"rejected configuration {index}: {exc}", title="Not priced"
        ) from None
    answer = {**entry, "index": index, "memory": memory, "profiles": profiles}
    return json.dumps(answer).encode()


def _priced_with(
    session: Session, plan_id: str, gpu: str, revision: int
) -> tuple[ProfileStore, dict[str, Any]]:
    """The profiles plan ``plan_id`` was priced with, or a 410 when they are gone."""
    snapshot = find_snapshot(session=session, gpu=gpu, revision=revision)
    if snapshot is None:
        raise problems.ApiProblem(
            410,
            "profiles-gone",
            f"plan {plan_id} was priced with revision {revision} of "
            f"{gpu!r}, made before this server kept the profiles of each revision, "
            "and the profile has changed since; submit the request again",
            title="Profiles no longer available",
        )
    return snapshot.store(), {"gpu": snapshot.gpu, "revision": snapshot.revision}


def _windowed(timeline: dict[str, Any], window: TimelineWindow) -> dict[str, Any]:
    if timeline["mode"] != "actions":
        return timeline
    end = math.inf if window.end_s is None else window.end_s
    selected: list[tuple[float, int, list[Any]]] = []
    for device in timeline["devices"]:
        for action in device["actions"]:
            if action[4] >= window.start_s and action[3] <= end:
                selected.append((action[3], device["device"], action))
    selected.sort(key=lambda item: (item[0], item[1]))
    kept = selected[: window.limit]
    devices: list[dict[str, Any]] = [
        {**{k: v for k, v in d.items() if k != "actions"}, "actions": []}
        for d in timeline["devices"]
    ]
    for _, device, action in kept:
        devices[device]["actions"].append(action)
    answer = {key: value for key, value in timeline.items() if key != "devices"}
    answer["devices"] = devices
    answer["window"] = {"start_s": window.start_s, "end_s": window.end_s}
    answer["truncated"] = len(selected) > len(kept)
    answer["next_start_s"] = selected[len(kept)][0] if answer["truncated"] else None
    return answer
