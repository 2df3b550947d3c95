"""OpenAPI response declarations shared by the routes."""

from __future__ import annotations

from typing import Any

from api.problems import PROBLEM_MEDIA_TYPE

__all__ = ["PLAN_EXAMPLES", "PROBLEM_REF", "problems_of"]

# create_app() adds the Problem schema to the OpenAPI components under this name.
PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}

_WHY = {
    400: "The body is not valid JSON.",
    401: "No bearer token, or a wrong one, where this server requires one.",
    403: "The token lacks the scope (read, write, admin) or does not own the plan.",
    404: "No such resource.",
    408: "The request body did not arrive within the server's time limit.",
    409: "The resource is not in a state that allows this.",
    410: "The profiles this plan was priced with are no longer kept.",
    413: "The request body is larger, or the request's estimated work or answer bigger, than "
    "this server accepts; 'detail' gives the figure and the limit.",
    415: "The body is not sent as JSON: send the header Content-Type: application/json.",
    422: "The request is invalid, cannot be planned, or is beyond this server's limits; "
    "'detail' says what to change.",
    503: "The database is unreachable (retry after Retry-After seconds) or the queue is full.",
}


def problems_of(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries: each status answers a problem document. 500 is always
    listed (a bug, never bad input)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in (*statuses, 500):
        out[status] = {
            "description": _WHY.get(status, "Internal error (a bug): the body names an error id."),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": PROBLEM_REF}},
        }
    return out


# Examples shown in /docs for POST /v1/plans.
PLAN_EXAMPLES = {
    "tiny": {
        "summary": "A tiny GPT on the 4-core CPU profile (every schedule)",
        "value": {
            "model": {
                "name": "tiny-gpt",
                "num_layers": 8,
                "hidden_size": 256,
                "num_attention_heads": 8,
                "seq_length": 128,
                "vocab_size": 1024,
            },
            "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 4},
            "training": {"global_batch_size": 16, "precision": "fp32"},
            "search": {"schedules": ["1f1b", "bpipe", "v-half"], "top_k": 5},
        },
    },
    "gpt3-96b": {
        "summary": "GPT-3 96B on 32 A100-80G (BPipe paper, Table 7)",
        "value": {
            "model": {
                "name": "gpt3-96b",
                "num_layers": 80,
                "hidden_size": 9984,
                "num_attention_heads": 104,
                "seq_length": 2048,
                "vocab_size": 51200,
            },
            "cluster": {"gpu": "a100-sxm-80g", "num_nodes": 4, "gpus_per_node": 8},
            "training": {"global_batch_size": 128},
            "search": {"schedules": ["1f1b", "bpipe"]},
        },
    },
}
