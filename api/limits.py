"""What one request may ask of the server: body size, search space, simulation size and
CP-SAT time. Each refusal names the limit and the value to stay under (413 or 422).

The model-shape ceilings are far above any real model (GPT-3 has 96 layers and h = 12288);
they keep arithmetic in range and a single request from occupying a planner thread for
long. The cluster, batch, top_k and list limits are settings an operator can raise.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.core.config import Settings
from api.problems import ApiProblem, problem_body, problem_response
from api.schemas import SimulateRequest
from planner.schedules import NUM_BATCHES, NUM_CHUNKS, schedule_family
from planner.specs import PlanRequest

__all__ = [
    "MODEL_LIMITS",
    "BodyLimitMiddleware",
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
_MAX_MICRO_BATCH = 1024


class BodyLimitMiddleware:
    """413 for a body over ``max_bytes``: at once from Content-Length, or while a body
    without one (chunked) arrives. The body is then replayed to the application."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send, declared)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, None)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int | None) -> None:
        told = f"is {size:,} bytes" if size is not None else "is larger than that"
        body = problem_body(
            413,
            "body-too-large",
            f"the request body {told}; this server accepts at most {self.max_bytes:,} bytes "
            "(send fewer entries per request, e.g. split a profile upload)",
            title="Request body too large",
            instance=str(scope.get("path", "")),
        )
        response = problem_response(body, {"Connection": "close"})
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _limit_error(loc: list[str | int], message: str) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": message, "type": "limit"}


def _raise(errors: list[dict[str, Any]]) -> None:
    if errors:
        shown = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in errors)
        raise ApiProblem(
            422,
            "limit-exceeded",
            f"the request is beyond this server's limits: {shown}",
            title="Request beyond the server's limits",
            errors=errors,
        )


def check_plan_request(request: PlanRequest, settings: Settings) -> tuple[PlanRequest, list[str]]:
    """The request as it will be planned, and warnings about what the server changed.

    Raises ApiProblem 422 (listing every limit broken, each with its value) for a search
    bigger than this server takes; lowers search.time_limit_s to the server's CP-SAT cap."""
    errors: list[dict[str, Any]] = []
    for (part, name), ceiling in MODEL_LIMITS.items():
        value = getattr(getattr(request, part), name)
        if value is not None and value > ceiling:
            errors.append(
                _limit_error(
                    [part, name], f"{value} is above the limit of {ceiling}; use at most {ceiling}"
                )
            )
    gpus = request.cluster.num_gpus
    if gpus > settings.max_gpus:
        errors.append(
            _limit_error(
                ["cluster"],
                f"num_nodes x gpus_per_node = {gpus} GPUs is above this server's limit of "
                f"{settings.max_gpus}; plan at most {settings.max_gpus} GPUs",
            )
        )
    batch = request.training.global_batch_size
    if batch > settings.max_global_batch_size:
        errors.append(
            _limit_error(
                ["training", "global_batch_size"],
                f"{batch} is above this server's limit of {settings.max_global_batch_size}",
            )
        )
    search = request.search
    if search.top_k > settings.max_top_k:
        errors.append(
            _limit_error(
                ["search", "top_k"],
                f"{search.top_k} is above this server's limit of {settings.max_top_k}; "
                f"ask for at most {settings.max_top_k} candidates",
            )
        )
    sizes = search.micro_batch_sizes or []
    if len(sizes) > settings.max_list_items:
        errors.append(
            _limit_error(
                ["search", "micro_batch_sizes"],
                f"{len(sizes)} sizes is above this server's limit of {settings.max_list_items} "
                "entries; list fewer",
            )
        )
    too_big = [s for s in sizes if s > _MAX_MICRO_BATCH]
    if too_big:
        errors.append(
            _limit_error(
                ["search", "micro_batch_sizes"],
                f"{too_big} above the limit of {_MAX_MICRO_BATCH} per micro-batch",
            )
        )
    _raise(errors)
    warnings = []
    cap = settings.max_cpsat_time_s
    if search.time_limit_s > cap:
        warnings.append(
            f"search.time_limit_s {search.time_limit_s:g} s lowered to this server's cap of "
            f"{cap:g} s"
        )
        request = request.model_copy(
            update={"search": search.model_copy(update={"time_limit_s": cap})}
        )
    return request, warnings


# Generator parameters the size of a generated schedule grows with.
_SIZE_PARAMETERS = (NUM_CHUNKS.name, NUM_BATCHES.name)


def simulate_cells(request: SimulateRequest) -> int:
    """devices x micro-batches, times chunks or batches for the families that take them
    (interleaved, 2bw): what the size of the generated schedule grows with."""
    cells = request.num_devices * request.num_microbatches
    family = schedule_family(request.schedule)
    for name in _SIZE_PARAMETERS:
        if family.has_parameter(name):
            cells *= getattr(request, name)
    return cells


def check_simulate_request(request: SimulateRequest, settings: Settings) -> None:
    cells = simulate_cells(request)
    if cells > settings.max_simulate_cells:
        family = schedule_family(request.schedule)
        _raise(
            [
                _limit_error(
                    ["num_microbatches"],
                    "num_devices x num_microbatches"
                    + "".join(f" x {n}" for n in _SIZE_PARAMETERS if family.has_parameter(n))
                    + f" = {cells} is above this server's limit of "
                    f"{settings.max_simulate_cells}; simulate fewer devices or micro-batches",
                )
            ]
        )
