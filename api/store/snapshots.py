"""Profile snapshots: the exact profiles a plan is priced with.

A hardware profile changes in place (its revision goes up); a plan names the revision it was
made on. The first plan made on a revision records that revision's profiles (hardware,
links, layer points) in ``profile_snapshots``, and the search and every later re-pricing of
the plan (its timeline) read them from there, so a plan stays reproducible after the
profile moved on, and a profile edited while a search waits cannot leak into it.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from api.profile_snapshot import Snapshot
from api.store.models import Hardware, LayerProfile, ProfileSnapshot, utcnow
from api.store.profiles import hardware_profile, layer_point, require_hardware
from planner.profiles import hardware_to_dict, point_to_dict

__all__ = ["Snapshot", "find_snapshot", "snapshot_current"]


def _of(row: ProfileSnapshot) -> Snapshot:
    return Snapshot(row.gpu, row.revision, dict(row.hardware), list(row.layer_points))


def snapshot_current(*, session: Session, gpu: str) -> Snapshot:
    """The snapshot of ``gpu``'s current revision, recorded now if it is the first.

    Reads the hardware row FOR SHARE: a profile write raises the revision under a row lock
    in its own transaction, so the revision and the profiles read here belong together.
    Raises UnknownHardwareError (listing the known names) when there is no such hardware.
    Does not commit."""
    row = session.scalar(select(Hardware).where(Hardware.name == gpu).with_for_update(read=True))
    if row is None:
        require_hardware(session=session, name=gpu)  # raises, naming the known ones
    assert row is not None
    stored = session.get(ProfileSnapshot, (gpu, row.revision))
    if stored is not None:
        return _of(stored)
    snapshot = _current(session, row)
    dialect = session.get_bind().dialect.name
    insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
    session.execute(
        insert(ProfileSnapshot)
        .values(
            gpu=gpu,
            revision=row.revision,
            hardware=snapshot.hardware,
            layer_points=snapshot.layer_points,
            created_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=["gpu", "revision"])
    )
    return snapshot


def find_snapshot(*, session: Session, gpu: str, revision: int) -> Snapshot | None:
    """The profiles (gpu, revision) priced plans with; for a plan stored before snapshots
    were kept, the current profiles while the hardware is still at that revision (they
    are the same); None when that revision's profiles are gone."""
    stored = session.get(ProfileSnapshot, (gpu, revision))
    if stored is not None:
        return _of(stored)
    row = session.get(Hardware, gpu)
    if row is None or row.revision != revision:
        return None
    return _current(session, row)


def _current(session: Session, row: Hardware) -> Snapshot:
    points = session.scalars(
        select(LayerProfile).where(LayerProfile.gpu == row.name).order_by(LayerProfile.id)
    )
    return Snapshot(
        gpu=row.name,
        revision=row.revision,
        hardware=hardware_to_dict(hardware_profile(row, session)),
        layer_points=[point_to_dict(layer_point(p)) for p in points],
    )
