"""Launch artefacts, materialized from the plan's compact form: one candidate's as JSON, or
every ranked candidate's files as the archive ``stagewright plan --emit`` would write."""

from __future__ import annotations

from typing import TYPE_CHECKING

from api import problems
from api.services import read_retried
from api.services.plans import load_done_plan, ranked_candidate
from planner.launch import materialize_launch
from planner.launch.files import launch_archive
from planner.schedules import schedule_actions
from planner.specs import STORED, Candidate, Plan, PlanRequest

if TYPE_CHECKING:
    from api.state import AppState

__all__ = ["candidate_launch", "plan_archive"]


@read_retried
def candidate_launch(state: AppState, plan_id: str, candidate: int) -> bytes:
    """The executor config with every action and rank, the torchrun lines, Megatron-LM's
    arguments and torch.distributed.pipelining's CSV of candidate ``candidate``; refused
    (413) when its schedule has more actions than this server materializes in one answer.
    As JSON bytes: encoded on this thread, not the event loop."""
    with state.database.session() as session:
        record = load_done_plan(session, plan_id, "ask for its launch artefacts")
        result = record.result or {}
    chosen = Candidate.model_validate(ranked_candidate(record, candidate))
    config = chosen.config
    actions = schedule_actions(
        config.schedule, config.p, config.num_microbatches, **config.schedule_parameters
    )
    limit = state.settings.max_launch_actions
    if actions > limit:
        raise problems.too_costly(
            f"candidate {candidate}'s schedule has about {actions:,} actions, more than the "
            f"{limit:,} this server materializes in one answer; run `stagewright plan "
            "--emit DIR` on the request to write its launch artefacts locally"
        )
    request = PlanRequest.model_validate(result["request"], context={STORED: True})
    launch = materialize_launch(request, chosen)
    return launch.model_dump_json().encode()


@read_retried
def plan_archive(state: AppState, plan_id: str) -> bytes:
    """Every ranked candidate's launch files (executor config, a torchrun script per node,
    Megatron-LM arguments and launch scripts, the torch CSV, README) as a gzipped tar under
    ``stagewright-plan-<id>/``; refused (413) when the schedules together have more actions
    than this server materializes in one answer."""
    with state.database.session() as session:
        record = load_done_plan(session, plan_id, "download its launch artefacts")
        result = record.result or {}
    plan = Plan.model_validate(result, context={STORED: True})
    actions = sum(
        schedule_actions(
            c.config.schedule, c.config.p, c.config.num_microbatches, **c.config.schedule_parameters
        )
        for c in plan.candidates
    )
    limit = state.settings.max_launch_actions
    if actions > limit:
        raise problems.too_costly(
            f"the plan's {len(plan.candidates)} candidates have about {actions:,} schedule "
            f"actions together, more than the {limit:,} this server materializes in one "
            "answer; download one candidate's launch (candidates/{n}/launch) or run "
            "`stagewright plan --emit DIR` on the request"
        )
    return launch_archive(plan, root=f"stagewright-plan-{plan_id}")
