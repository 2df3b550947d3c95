"""The cache key of a plan request.

Two requests get the same key when their JSON is the same (after validation, so defaults and
the order of keys do not matter), they plan on the same revision of the hardware profile
(which goes up with every change to it, its links or its layer points), and the planner is
the same (its version and a digest of its source). A stored plan is reused only for its key.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import planner
from planner.specs import PlanRequest

__all__ = ["planner_fingerprint", "request_hash"]


@lru_cache(maxsize=1)
def planner_fingerprint() -> str:
    """Version + digest of planner/*.py: a changed planner never serves an old plan."""
    digest = hashlib.sha256()
    try:
        digest.update(metadata.version("stagewright").encode())
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        digest.update(b"unversioned")
    root = Path(planner.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def request_hash(request: PlanRequest, hardware_revision: int) -> str:
    canonical = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    key = f"{canonical}|{request.cluster.gpu}@{hardware_revision}|{planner_fingerprint()}"
    return hashlib.sha256(key.encode()).hexdigest()
