"""What one request may ask of the server: body size and arrival time, search space, the
estimated work and answer size of a search, simulation size and work, and CP-SAT time. Each
refusal names the limit and the value to stay under (408, 413 or 422), and a refusal by
a setting names its environment variable and the value this request needs.

Cheap structural limits come first (each field against its ceiling), then the up-front
cost estimate (``planner.search.cost``: milliseconds, independent of how many GPUs are
named), all before any search is queued.

The model-shape ceilings are far above any real model (GPT-3 has 96 layers and h = 12288);
they keep arithmetic in range and a single request from occupying a planner thread for
long. The cluster, batch, top_k and list limits are settings an operator can raise.
"""

from __future__ import annotations

from typing import Any

import anyio
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.core.config import ENV_PREFIX, Settings
from api.problems import (
    body_timeout_body,
    body_too_large_body,
    limit_error,
    limit_exceeded,
    problem_response,
    too_costly,
)
from api.schemas import ProfilesIn, SimulateRequest
from planner.errors import ScheduleConfigError
from planner.schedules import (
    NUM_BATCHES,
    NUM_CHUNKS,
    generation_work,
    schedule_actions,
    schedule_family,
)
from planner.search.cost import search_cost
from planner.specs import PlanRequest

__all__ = [
    "MAX_MICRO_BATCH",
    "MODEL_LIMITS",
    "BodyLimitMiddleware",
    "check_list_lengths",
    "check_plan_request",
    "check_simulate_request",
]

# Field of ModelSpec / ClusterSpec -> largest value accepted.
MODEL_LIMITS: dict[tuple[str, str], int] = {
    ("model", "num_layers"): 1024,
    ("model", "hidden_size"): 131_072,
    ("model", "num_attention_heads"): 1024,
    ("model", "ffn_hidden_size"): 1_048_576,
    ("model", "seq_length"): 1_048_576,
    ("model", "vocab_size"): 4_194_304,
    ("cluster", "gpus_per_node"): 256,
}
MAX_MICRO_BATCH = 1024


class BodyLimitMiddleware:
    """413 for a body over ``max_bytes``: at once from Content-Length, or while a body
    without one (chunked) arrives; 408 when the whole body has not arrived within
    ``timeout_s`` (a client that stalls cannot hold a connection). The body is then
    replayed to the application."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _refuse(scope, receive, send, body_too_large_body(declared, self.max_bytes, path))
            return
        try:
            with anyio.fail_after(self.timeout_s):
                body = await self._read(receive)
        except TimeoutError:
            await _refuse(scope, receive, send, body_timeout_body(self.timeout_s, path))
            return
        except _TooLarge:
            await _refuse(scope, receive, send, body_too_large_body(None, self.max_bytes, path))
            return
        if body is None:  # the client went away
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        return b"".join(chunks)


class _TooLarge(Exception):
    pass


async def _refuse(scope: Scope, receive: Receive, send: Send, body: dict[str, Any]) -> None:
    await problem_response(body, {"Connection": "close"})(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _raise_setting(*needs: tuple[str, int]) -> str:
    """How an operator lets this request through: each setting's environment variable with
    the value the request needs (the defaults protect a shared service; see the README)."""
    settings = " ".join(f"{ENV_PREFIX}{name.upper()}={value}" for name, value in needs)
    return f"start the server with {settings} (what this request needs)"


def _raise(errors: list[dict[str, Any]]) -> None:
    if errors:
        shown = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in errors)
        raise limit_exceeded(f"the request is beyond this server's limits: {shown}", errors)


# The lists whose length a setting bounds, per body model: where the list is, the setting,
# what its entries are, the limit's unit and what to do instead.
_LIST_LIMITS: dict[type[BaseModel], tuple[tuple[tuple[str, ...], str, str, str, str], ...]] = {
    PlanRequest: (
        (("search", "micro_batch_sizes"), "max_list_items", "sizes", "entries", "list fewer"),
        (("search", "num_chunks"), "max_list_items", "chunk counts", "entries", "list fewer"),
    ),
    ProfilesIn: (
        (
            ("layers",),
            "max_profile_points",
            "layer points",
            "per request",
            "send them in several requests",
        ),
    ),
}


def check_list_lengths(model: type[BaseModel], body: Any, settings: Settings) -> None:
    """422 for a list over its setting's limit, read from the parsed JSON before ``model``
    validates it: pydantic checks (and reports) every entry first, and 150,000 strings for
    micro-batch sizes were 150,000 errors before the limit of 16 was looked at. Whatever
    is not a list there is left to the model to refuse."""
    errors = []
    for path, setting, entries, unit, instead in _LIST_LIMITS.get(model, ()):
        value = body
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        limit = getattr(settings, setting)
        if isinstance(value, list) and len(value) > limit:
            errors.append(
                limit_error(
                    list(path),
                    f"{len(value)} {entries} is above this server's limit of {limit} {unit}; "
                    f"{instead}, or " + _raise_setting((setting, len(value))),
                )
            )
    _raise(errors)


def check_plan_request(request: PlanRequest, settings: Settings) -> tuple[PlanRequest, list[str]]:
    """The request as it will be planned, and warnings about what the server changed.

    Raises ApiProblem 422 (listing every limit broken, each with its value) for a search
    bigger than this server takes; lowers a CP-SAT search's time_limit_s to the server's
    CP-SAT cap, and the default top_k of a request that names none to the server's
    limit."""
    warnings = []
    search = request.search
    if search.top_k > settings.max_top_k and "top_k" not in search.model_fields_set:
        # The planner's default, not a number the client sent: refusing it ("top_k: 10 is
        # above this server's limit of 5") named a value the request does not hold.
        warnings.append(
            f"search.top_k not given: {settings.max_top_k} candidates (this server's limit) "
            f"rather than the default {search.top_k}"
        )
        search = search.model_copy(update={"top_k": settings.max_top_k})
        request = request.model_copy(update={"search": search})
    errors: list[dict[str, Any]] = []
    for (part, name), ceiling in MODEL_LIMITS.items():
        value = getattr(getattr(request, part), name)
        if value is not None and value > ceiling:
            errors.append(
                limit_error(
                    [part, name], f"{value} is above the limit of {ceiling}; use at most {ceiling}"
                )
            )
    gpus = request.cluster.num_gpus
    if gpus > settings.max_gpus:
        errors.append(
            limit_error(
                ["cluster"],
                f"num_nodes x gpus_per_node = {gpus} GPUs is above this server's limit of "
                f"{settings.max_gpus}; plan at most {settings.max_gpus} GPUs, or "
                + _raise_setting(("max_gpus", gpus)),
            )
        )
    batch = request.training.global_batch_size
    if batch > settings.max_global_batch_size:
        errors.append(
            limit_error(
                ["training", "global_batch_size"],
                f"{batch} is above this server's limit of {settings.max_global_batch_size}; "
                + _raise_setting(("max_global_batch_size", batch)),
            )
        )
    if search.top_k > settings.max_top_k:
        errors.append(
            limit_error(
                ["search", "top_k"],
                f"{search.top_k} is above this server's limit of {settings.max_top_k}; "
                f"ask for at most {settings.max_top_k} candidates, or "
                + _raise_setting(("max_top_k", search.top_k)),
            )
        )
    # The lists' lengths were checked before the body was validated (check_list_lengths).
    too_big = [s for s in search.micro_batch_sizes or [] if s > MAX_MICRO_BATCH]
    if too_big:
        errors.append(
            limit_error(
                ["search", "micro_batch_sizes"],
                f"{too_big} above the limit of {MAX_MICRO_BATCH} per micro-batch",
            )
        )
    _raise(errors)
    _check_search_cost(request, settings)
    cap = settings.max_cpsat_time_s
    # Only CP-SAT runs for time_limit_s: a grid request carries the default (any other
    # value is refused), and lowering it would echo a request that is refused when posted
    # again (a cap under the default), with a warning about a limit nothing used.
    if search.method == "cpsat" and search.time_limit_s > cap:
        warnings.append(
            f"search.time_limit_s {search.time_limit_s:g} s lowered to this server's cap of "
            f"{cap:g} s"
        )
        request = request.model_copy(
            update={"search": search.model_copy(update={"time_limit_s": cap})}
        )
    return request, warnings


def _check_search_cost(request: PlanRequest, settings: Settings) -> None:
    """413 when the search's estimated work or answer size (planner.search.cost, upper
    bounds computed in milliseconds) is over this server's limit, naming both figures."""
    cost = search_cost(request)
    needs = [
        (name, value)
        for name, value, limit in (
            ("max_plan_work", cost.work, settings.max_plan_work),
            ("max_plan_bytes", cost.plan_bytes, settings.max_plan_bytes),
        )
        if value > limit
    ]
    if cost.work > settings.max_plan_work:
        raise too_costly(
            f"this search would price {cost.configurations:,} configurations (pipelines up "
            f"to {cost.largest_pipeline} devices) for an estimated work of {cost.work:,} "
            f"units, over this server's limit of {settings.max_plan_work:,}; search fewer "
            "schedules or micro-batch sizes, ask for fewer candidates (top_k), or plan on "
            "fewer GPUs; or " + _raise_setting(*needs)
        )
    if cost.plan_bytes > settings.max_plan_bytes:
        top_k = _largest_top_k(request, settings.max_plan_bytes)
        advice = f"ask for top_k <= {top_k}" if top_k else "search fewer schedules"
        advice += "; or " + _raise_setting(*needs)
        raise too_costly(
            f"the plan would be about {cost.plan_bytes:,} bytes of JSON, over this server's "
            f"limit of {settings.max_plan_bytes:,} ({request.search.top_k} candidates with "
            f"pipelines up to {cost.largest_pipeline} devices); {advice}"
        )


def _largest_top_k(request: PlanRequest, max_bytes: int) -> int:
    """The largest top_k whose plan stays under ``max_bytes`` (0 if none does)."""
    low, high = 0, request.search.top_k - 1
    while low < high:
        middle = (low + high + 1) // 2
        search = request.search.model_copy(update={"top_k": middle})
        if search_cost(request.model_copy(update={"search": search})).plan_bytes <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return low


# Generator parameters the size of a generated schedule grows with.
_SIZE_PARAMETERS = (NUM_CHUNKS.name, NUM_BATCHES.name)


def _generator_parameters(request: SimulateRequest) -> dict[str, float]:
    """The size parameters of the request that its schedule's family takes, at the
    family's default where the request leaves them null."""
    given = request.generator_parameters()
    return {
        p.name: given.get(p.name, p.default)
        for p in schedule_family(request.schedule).parameters
        if p.name in _SIZE_PARAMETERS and p.default is not None
    }


def simulate_cells(request: SimulateRequest) -> int:
    """devices x micro-batches, times chunks or batches for the families that take them
    (interleaved, 2bw): what the size of the generated schedule grows with."""
    cells = request.num_devices * request.num_microbatches
    for value in _generator_parameters(request).values():
        cells *= int(value)
    return cells


def check_simulate_request(request: SimulateRequest, settings: Settings) -> None:
    """422 beyond the cell limit (devices x micro-batches); 413 when building and simulating
    the schedule is estimated over ``max_simulate_work`` (the V-shape generators' work grows
    faster than their size)."""
    cells = simulate_cells(request)
    parameters = _generator_parameters(request)
    if cells > settings.max_simulate_cells:
        _raise(
            [
                limit_error(
                    ["num_microbatches"],
                    "num_devices x num_microbatches"
                    + "".join(f" x {n}" for n in parameters)
                    + f" = {cells} is above this server's limit of "
                    f"{settings.max_simulate_cells}; simulate fewer devices or micro-batches, "
                    "or " + _raise_setting(("max_simulate_cells", cells)),
                )
            ]
        )
    name, devices, microbatches = request.schedule, request.num_devices, request.num_microbatches
    try:
        work = generation_work(name, devices, microbatches, **parameters)
        work += schedule_actions(name, devices, microbatches, **parameters)
    except ScheduleConfigError:
        return  # the generator itself says what is wrong, with the same message as the CLI
    if work > settings.max_simulate_work:
        raise too_costly(
            f"building and simulating {request.schedule} on {request.num_devices} devices x "
            f"{request.num_microbatches} micro-batches is an estimated {work:,} units of work, "
            f"over this server's limit of {settings.max_simulate_work:,}; simulate fewer "
            "devices or micro-batches, or " + _raise_setting(("max_simulate_work", work))
        )
