"""A search process: runs plan searches sent by its server, under a memory limit.

Started by ``api.jobs.search.SearchProcess`` as ``python -m api.jobs.worker FUNCTION MB``:
it limits its own address space to MB megabytes (RLIMIT_AS), imports the search function
(``module:name``, normally ``planner.plan:plan``), then answers one message at a time on
stdin/stdout (a 4-byte length, then JSON). A request carries the plan request and the
profile snapshot to price it with; the answer is the Plan's JSON or why there is none. A
search that runs out of memory answers so and exits (a new process replaces it); one that
takes too long is killed by the server. Either way the server stays up.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import struct
import sys
import traceback
from collections.abc import Callable
from typing import IO, Any

__all__ = ["main", "read_message", "write_message"]

_LENGTH = struct.Struct(">I")


def read_message(stream: IO[bytes]) -> dict[str, Any] | None:
    """The next message, or None at the end of the stream."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    message: dict[str, Any] = json.loads(data)
    return message


def write_message(stream: IO[bytes], message: dict[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _limit_memory(megabytes: int) -> None:
    limit = megabytes * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _function(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return found


def _search(function: Callable[..., Any], message: dict[str, Any]) -> dict[str, Any]:
    from pydantic import ValidationError

    from api.profile_snapshot import Snapshot
    from planner.errors import StagewrightError
    from planner.specs import STORED, PlanRequest

    try:
        request = PlanRequest.model_validate(message["request"], context={STORED: True})
    except ValidationError as exc:  # a stored request no longer valid for this version
        return {
            "outcome": "refused",
            "detail": f"the stored request is not valid for this version of stagewright: "
            f"{exc.errors()[0]['msg']}; submit it again",
        }
    store = Snapshot.from_json(message["snapshot"]).store()
    try:
        plan = function(request, store)
    except StagewrightError as exc:
        return {"outcome": "refused", "detail": str(exc)}
    # Through pydantic's JSON encoder: non-finite floats become null, as clients see them.
    return {"outcome": "done", "plan": json.loads(plan.model_dump_json())}


def main(argv: list[str] | None = None) -> int:
    function_path, megabytes = (argv or sys.argv[1:])[:2]
    # The protocol owns stdout; anything printed goes to the server's log instead.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _limit_memory(int(megabytes))
    function = _function(function_path)
    while (message := read_message(sys.stdin.buffer)) is not None:
        try:
            answer = _search(function, message)
        except MemoryError:
            answer = {"outcome": "memory"}
        except Exception:
            answer = {"outcome": "bug", "traceback": traceback.format_exc()[-4000:]}
        try:
            write_message(channel, answer)
        except MemoryError:
            return 3
        except BrokenPipeError:  # the server is gone (killed): nobody is left to answer
            return 0
        if answer["outcome"] == "memory":
            return 3  # the heap may be fragmented past use: let a new process take over
    return 0


if __name__ == "__main__":
    sys.exit(main())
