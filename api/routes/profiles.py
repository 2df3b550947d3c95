"""/v1/profiles: the measured layer points and links the cost model uses."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from starlette.responses import Response

from api.deps import WRITE, SessionDep, SettingsDep, strict_body
from api.problems import ApiProblem
from api.routes._docs import problems
from api.schemas import (
    HARDWARE_NAME_PATTERN,
    LayerPointPublic,
    LinkPublic,
    ProfilesIn,
    ProfilesPublic,
    ProfilesWriteResult,
)
from api.store.models import CommProfile, LayerProfile
from api.store.profiles import (
    WriteReport,
    count_layer_points,
    get_hardware,
    list_layer_points,
    list_links,
    upsert_layer_point,
    upsert_link,
)
from planner.profiles import Link

__all__ = ["router"]

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])


def _layer(row: LayerProfile) -> LayerPointPublic:
    return LayerPointPublic.model_validate(
        {
            "id": row.id,
            "gpu": row.gpu,
            "precision": row.precision,
            "hidden_size": row.hidden_size,
            "num_attention_heads": row.num_attention_heads,
            "ffn_hidden_size": row.ffn_hidden_size,
            "seq_length": row.seq_length,
            "micro_batch_size": row.micro_batch_size,
            "t": row.t,
            "recompute": row.recompute,
            "sequence_parallel": row.sequence_parallel,
            "flash_attention": row.flash_attention,
            "forward_ms": row.forward_ms,
            "backward_ms": row.backward_ms,
            "weight_ms": row.weight_ms,
            "activation_bytes": row.activation_bytes,
            "includes_tp_comm": row.includes_tp_comm,
            "source": row.source,
            "origin": row.origin,
            "updated_at": row.updated_at,
        }
    )


def _link(row: CommProfile) -> LinkPublic:
    return LinkPublic.model_validate(
        {
            "gpu": row.gpu,
            "scope": row.scope,
            "kind": row.kind,
            "bandwidth_gbps": row.bandwidth_gbps,
            "latency_us": row.latency_us,
            "source": row.source,
            "origin": row.origin,
            "updated_at": row.updated_at,
        }
    )


@router.get(
    "",
    response_model=ProfilesPublic,
    summary="Layer points and links",
    responses=problems(422, 503),
)
def read_profiles(
    session: SessionDep,
    gpu: Annotated[
        str | None,
        Query(pattern=HARDWARE_NAME_PATTERN, description="Only this hardware's profiles."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Layer points per page.")] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="Layer points to skip.")] = 0,
) -> ProfilesPublic:
    layers = list_layer_points(session=session, gpu=gpu, limit=limit, offset=offset)
    return ProfilesPublic(
        layers=[_layer(row) for row in layers],
        links=[_link(row) for row in list_links(session=session, gpu=gpu)],
        total_layers=count_layer_points(session=session, gpu=gpu),
        limit=limit,
        offset=offset,
    )


@router.post(
    "",
    response_model=ProfilesWriteResult,
    status_code=201,
    dependencies=[*WRITE, Depends(strict_body(ProfilesIn))],
    summary="Store layer points and links (replacing those of the same shape)",
    responses={
        200: {
            "model": ProfilesWriteResult,
            "description": "Nothing was new (all replaced or identical).",
        },
        **problems(400, 401, 413, 422, 503),
    },
)
def write_profiles(
    body: ProfilesIn, session: SessionDep, settings: SettingsDep, response: Response
) -> ProfilesWriteResult:
    if len(body.layers) > settings.max_profile_points:
        raise ApiProblem(
            422,
            "limit-exceeded",
            f"{len(body.layers)} layer points is above this server's limit of "
            f"{settings.max_profile_points} per request; send them in several requests",
            title="Request beyond the server's limits",
        )
    gpus = sorted({p.gpu for p in body.layers} | {link.gpu for link in body.links})
    unknown = [gpu for gpu in gpus if get_hardware(session=session, name=gpu) is None]
    if unknown:
        raise ApiProblem(
            422,
            "unknown-hardware",
            f"no hardware profile {', '.join(repr(u) for u in unknown)}; create it first with "
            "POST /v1/hardware (GET /v1/hardware lists the known ones)",
            title="Unknown hardware",
        )
    report = WriteReport()
    for point in body.layers:
        upsert_layer_point(session=session, point=point.to_point(), origin="api", report=report)
    for link in body.links:
        outcome = upsert_link(
            session=session,
            gpu=link.gpu,
            scope=link.scope,
            link=Link(link.kind, link.bandwidth_gbps, link.latency_us),
            source=link.source,
            origin="api",
            report=report,
        )
        report.add(outcome)
    session.commit()
    if not report.created:
        response.status_code = 200
    return ProfilesWriteResult(
        created=report.created,
        updated=report.updated,
        unchanged=report.unchanged,
        revisions=dict(sorted(report.revisions.items())),
    )
