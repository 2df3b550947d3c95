"""Layer points and links: list them, store them (atomic upserts, one revision per write)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from api import problems
from api.schemas import (
    LayerPointPublic,
    LinkPublic,
    ProfilesIn,
    ProfilesPublic,
    ProfilesWriteResult,
)
from api.services import read_retried
from api.store.models import CommProfile, LayerProfile
from api.store.profiles import (
    WriteReport,
    count_layer_points,
    list_layer_points,
    list_links,
    lock_hardware,
    upsert_layer_point,
    upsert_link,
)
from planner.profiles import Link

if TYPE_CHECKING:
    from api.state import AppState

__all__ = ["read_profiles", "write_profiles"]


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


@read_retried
def read_profiles(state: AppState, *, gpu: str | None, limit: int, offset: int) -> ProfilesPublic:
    with state.database.session() as session:
        layers = list_layer_points(session=session, gpu=gpu, limit=limit, offset=offset)
        return ProfilesPublic(
            layers=[_layer(row) for row in layers],
            links=[_link(row) for row in list_links(session=session, gpu=gpu)],
            total_layers=count_layer_points(session=session, gpu=gpu),
            limit=limit,
            offset=offset,
        )


def write_profiles(state: AppState, body: ProfilesIn) -> ProfilesWriteResult:
    """Store layer points and links (a point of a stored shape replaces it) in one
    transaction: every hardware touched is locked first, and its revision raised once."""
    # The number of points was checked before the body was validated (check_list_lengths).
    gpus = {p.gpu for p in body.layers} | {link.gpu for link in body.links}
    report = WriteReport()
    with state.database.session(write=True) as session:
        unknown = lock_hardware(session=session, names=gpus)
        if unknown:
            raise problems.ApiProblem(
                422,
                "unknown-hardware",
                f"no hardware profile {', '.join(repr(u) for u in unknown)}; create it first "
                "with POST /v1/hardware (GET /v1/hardware lists the known ones)",
                title="Unknown hardware",
            )
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
    return ProfilesWriteResult(
        created=report.created,
        updated=report.updated,
        unchanged=report.unchanged,
        revisions=dict(sorted(report.revisions.items())),
    )
