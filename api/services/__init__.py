"""The service layer: every use case of the REST API, as plain functions.

Routes parse the request, call one of these (on a thread, through ``api.state.offload``)
and turn the result into a response; they hold no logic of their own. A use case opens its
own database sessions and finishes with them before it returns, so nothing touches the
database once a response has started. Errors are ``api.problems`` values, rendered in one
place. Modules: ``plans`` (submit, wait, read, list, delete), ``measurements``,
``launches`` (a candidate's full launch artefacts), ``timelines``, ``hardware``,
``profiles``, ``simulate`` and ``health``; ``cache`` keeps what a done plan answers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from api.core.db import is_unavailable

__all__ = ["read_retried"]

log = logging.getLogger("stagewright.services")

P = ParamSpec("P")
T = TypeVar("T")


def read_retried(fn: Callable[P, T]) -> Callable[P, T]:
    """For idempotent reads: when the database connection was lost (a backend restarted or
    killed, a pooled connection gone stale), run once more on a fresh connection before
    answering 503."""

    @functools.wraps(fn)
    def once_more(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            log.info("%s: database connection lost, reading once more", fn.__name__)
            return fn(*args, **kwargs)

    return once_more
