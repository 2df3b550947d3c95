"""The OpenAPI document: FastAPI's, plus the Problem schema and the limits this server
enforces, so that what the document says a request may be is what the server accepts
(``wait_s`` up to ``max_wait_s``, ``top_k`` up to ``max_top_k``, the model-shape ceilings,
...). Limits that span fields (GPUs = nodes x GPUs per node, the estimated work of a search)
cannot be stated in a schema; the descriptions name them."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.core.config import Settings
from api.limits import MAX_MICRO_BATCH, MODEL_LIMITS
from api.schemas import Problem
from planner.specs import SearchSpec

__all__ = ["openapi_document"]

_SPEC_SCHEMAS = {"model": "ModelSpec", "cluster": "ClusterSpec"}


def _components(schema: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The component ``name``, or its request variant when FastAPI split it in two."""
    components = schema.get("components", {}).get("schemas", {})
    found = [components[key] for key in (name, f"{name}-Input") if key in components]
    return found


def _set(schema: dict[str, Any], name: str, field: str, **bounds: Any) -> None:
    for component in _components(schema, name):
        prop = component.get("properties", {}).get(field)
        if prop is None:
            continue
        target = prop
        if "anyOf" in prop:  # an optional field: bound its non-null branch
            target = next((b for b in prop["anyOf"] if b.get("type") != "null"), prop)
        target.update(bounds)


def _limits(schema: dict[str, Any], settings: Settings) -> None:
    for (part, field), ceiling in MODEL_LIMITS.items():
        _set(schema, _SPEC_SCHEMAS[part], field, maximum=ceiling)
    _set(schema, "ClusterSpec", "num_nodes", maximum=settings.max_gpus)
    _set(schema, "TrainingSpec", "global_batch_size", maximum=settings.max_global_batch_size)
    # A request that names no top_k gets the default, or the server's limit if lower.
    top_k = min(SearchSpec.model_fields["top_k"].default, settings.max_top_k)
    _set(schema, "SearchSpec", "top_k", maximum=settings.max_top_k, default=top_k)
    for component in _components(schema, "SearchSpec"):
        sizes = component.get("properties", {}).get("micro_batch_sizes", {})
        for branch in sizes.get("anyOf", [sizes]):
            if branch.get("type") == "array":
                branch["maxItems"] = settings.max_list_items
                branch.setdefault("items", {})["maximum"] = MAX_MICRO_BATCH
        chunks = component.get("properties", {}).get("num_chunks", {})
        for branch in chunks.get("anyOf", [chunks]):
            if branch.get("type") == "array":
                branch["maxItems"] = settings.max_list_items
    _set(schema, "ProfilesIn", "layers", maxItems=settings.max_profile_points)
    post = schema.get("paths", {}).get("/v1/plans", {}).get("post", {})
    for parameter in post.get("parameters", []):
        if parameter.get("name") == "wait_s":
            for branch in parameter["schema"].get("anyOf", [parameter["schema"]]):
                if branch.get("type") == "number":
                    branch["maximum"] = settings.max_wait_s


def openapi_document(app: FastAPI, settings: Settings) -> dict[str, Any]:
    """FastAPI's schema, the Problem model the error responses refer to, and the limits."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in problem.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components["Problem"] = problem
    _limits(schema, settings)
    app.openapi_schema = schema
    return schema
