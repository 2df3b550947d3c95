"""The SQL store on SQLite and PostgreSQL: migrations match the models, the bundled profiles
load idempotently, the SQL profile store plans like the JSON one, and jobs are claimed once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import column as sa_column
from sqlalchemy import create_engine, inspect, select, text, update
from sqlalchemy import table as sa_table

from api.core.db import Database, alembic_config, migrate
from api.problems import search_interrupted_body
from api.store import crud
from api.store.models import (
    Base,
    Hardware,
    Job,
    MeasuredRunRecord,
    Measurement,
    PlanRecord,
    utcnow,
)
from api.store.profiles import (
    SqlProfileStore,
    WriteReport,
    load_bundled_profiles,
    upsert_hardware,
    upsert_layer_point,
)
from api.store.profiles_io import store_layer_point
from planner.measurements import MeasuredRun, StepMeasurement, candidate_config, fingerprint
from planner.plan import plan
from planner.profiles import (
    CalibrationRecord,
    JsonProfileStore,
    LayerPoint,
    ProfileStore,
    UnknownHardwareError,
)
from planner.specs import PlanRequest
from tests.integration.conftest import PG_ADMIN_URL, REPO, example, reset, schema_url
from tests.integration.test_measured_runs import RUN

TABLES = {
    "hardware",
    "comm_profiles",
    "layer_profiles",
    "plans",
    "jobs",
    "measurements",
    "measured_runs",
    "calibrations",
}


@pytest.fixture
def database(database_url):
    reset(database_url)
    db = Database(database_url)
    yield db
    db.dispose()


def test_migrated_schema_matches_the_models(database):
    with database.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
        assert TABLES <= set(inspect(conn).get_table_names())


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request, tmp_path):
    """A database with nothing in it yet."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    schema = request.getfixturevalue("postgres_schema") + "_empty"
    admin = create_engine(PG_ADMIN_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield schema_url(schema)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def test_alembic_command_line_upgrades_checks_and_downgrades(empty_database_url):
    """`alembic upgrade head` as CI and operators run it, from the repository root; then
    `alembic check` finds nothing the models have that the migrations lack."""
    env = {**os.environ, "STAGEWRIGHT_DATABASE_URL": empty_database_url}
    alembic = [sys.executable, "-m", "alembic"]
    for args in (["upgrade", "head"], ["check"], ["downgrade", "base"], ["upgrade", "head"]):
        done = subprocess.run(
            alembic + args, cwd=REPO, env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
    current = subprocess.run(
        [*alembic, "current"], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert f"{head} (head)" in current.stdout


def _profiles_load(url: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "profiles", "load", "--database-url", url],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, done.stderr


def _migrated(url: str) -> None:
    database = Database(url)
    try:
        migrate(database)
    finally:
        database.dispose()


def test_a_schema_newer_than_the_code_is_one_line_and_left_alone(empty_database_url):
    """An image rolled back after a newer one migrated the database: `serve` and `profiles
    load` ended in Alembic's traceback ("Can't locate revision identified by ...")."""
    _migrated(empty_database_url)
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099_future'"))
    code, err = _profiles_load(empty_database_url)
    assert code == 2 and "Traceback" not in err, err
    assert err.count("\n") == 1
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert "the database's schema is at revision 0099_future" in err
    assert f"newest this version of stagewright knows is {head}" in err
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == (
            "0099_future"
        )
    engine.dispose()


def test_stagewrights_tables_without_a_schema_revision_are_one_line(empty_database_url):
    """A database whose tables were made without the migrations (or whose alembic_version
    was dropped): the upgrade began again from the first migration and ended in a
    traceback ("table hardware already exists")."""
    _migrated(empty_database_url)
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE alembic_version"))
    engine.dispose()
    code, err = _profiles_load(empty_database_url)
    assert code == 2 and "Traceback" not in err, err
    assert err.count("\n") == 1
    assert "has stagewright's tables (" in err and "but no alembic_version" in err


def test_a_database_with_other_tables_only_is_migrated(empty_database_url):
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE notes (body TEXT)"))
    engine.dispose()
    assert _profiles_load(empty_database_url)[0] == 0


def test_loading_the_bundled_profiles_twice_changes_nothing(database):
    with database.session() as session:
        report = load_bundled_profiles(session=session)
    assert (report.created, report.updated) == (0, 0)
    assert report.unchanged == 7 + 14
    with database.session() as session:
        assert all(h.revision == 1 for h in session.scalars(select(Hardware)))


def test_loading_keeps_api_edits_and_repairs_bundled_rows(database):
    with database.session() as session:
        a100 = session.get(Hardware, "a100-sxm-80g")
        a100.origin = "api"
        a100.memory_gib = 81.0
        v100 = session.get(Hardware, "v100-16g")
        v100.memory_gib = 1.0  # an older release's bundled value
        session.commit()
    with database.session() as session:
        report = load_bundled_profiles(session=session)
        assert report.updated == 1 and report.revisions["v100-16g"] == 2
        assert session.get(Hardware, "a100-sxm-80g").memory_gib == 81.0
        assert session.get(Hardware, "v100-16g").memory_gib == 15.8


def test_loading_keeps_a_calibrated_profiles_parameters(database):
    """A fitted profile survives `profiles load` (which `serve` runs at every start): its
    parameters and calibration record stay, while a release's other values still apply."""
    record = CalibrationRecord(
        fitted_at="2026-01-02T00:00:00+00:00",
        num_runs=3,
        rms_log_error=0.04,
        rms_log_error_before=0.3,
        fitted=["gemm_efficiency"],
        revision=2,
    )
    with database.session() as session:
        fitted = JsonProfileStore.load().hardware("a100-sxm-80g")
        fitted = fitted.with_parameters({"gemm_efficiency": 0.5}, record)
        upsert_hardware(session=session, profile=fitted, origin="bundled", report=WriteReport())
        session.get(Hardware, "a100-sxm-80g").memory_gib = 1.0  # an older release's value
        session.commit()
    with database.session() as session:
        load_bundled_profiles(session=session)
    stored = SqlProfileStore(database.sessions).hardware("a100-sxm-80g")
    assert stored.parameters == {"gemm_efficiency": 0.5}
    assert stored.calibration == record
    assert stored.memory_gib == 80.0


def test_sql_profile_store_is_a_profile_store_that_plans_like_the_json_one(database):
    store: ProfileStore = SqlProfileStore(database.sessions)
    bundled = JsonProfileStore.load()
    assert store.hardware_names() == bundled.hardware_names()
    assert store.hardware("a100-sxm-80g") == bundled.hardware("a100-sxm-80g")
    assert list(store.layer_points("a100-sxm-80g")) == list(bundled.layer_points("a100-sxm-80g"))
    with pytest.raises(UnknownHardwareError, match="known hardware profiles: a100-40g"):
        store.hardware("tpu-v9")
    request = PlanRequest.model_validate(example("gpt3-13b-8xa100"))
    ours, theirs = plan(request, store), plan(request, bundled)
    assert ours.candidates == theirs.candidates and ours.rejected == theirs.rejected


def test_store_layer_point_for_command_line_tools(database_url, database):
    point = LayerPoint(
        gpu="cpu",
        precision="fp32",
        hidden_size=256,
        num_attention_heads=8,
        ffn_hidden_size=1024,
        seq_length=128,
        micro_batch_size=1,
        t=1,
        recompute="none",
        sequence_parallel=False,
        flash_attention=False,
        forward_ms=1.0,
        backward_ms=1.0,
        weight_ms=0.5,
        activation_bytes=1e6,
        includes_tp_comm=True,
        source="measured",
    )
    where = store_layer_point(database_url, point)
    assert "created" in where and "cpu revision 2" in where
    assert list(SqlProfileStore(database.sessions).layer_points("cpu")) == [point]
    with pytest.raises(UnknownHardwareError):
        store_layer_point(database_url, LayerPoint(**{**point.__dict__, "gpu": "nope"}))


def _queued(session) -> tuple[PlanRecord, Job]:
    admitted = crud.admit_plan(
        session=session,
        request=example("tiny-cpu"),
        request_hash="0" * 64,
        model_name="tiny",
        gpu="cpu",
        num_gpus=4,
        method="grid",
        hardware_revision=1,
        warnings=[],
        created_by=None,
        max_queued=10,
    )
    job = session.get(Job, admitted.job_id)
    assert job is not None
    return session.get(PlanRecord, admitted.plan_id), job


def test_a_job_is_claimed_once_and_finished_only_by_its_claimer(database):
    with database.session() as session:
        _, job = _queued(session)
    with database.session() as a, database.session() as b:
        first = crud.claim_job(session=a, job_id=job.id, worker="host:1:a")
        second = crud.claim_job(session=b, job_id=job.id, worker="host:2:b")
    assert first is not None and second is None
    with database.session() as session:
        assert session.get(PlanRecord, first.plan_id).status == "running"
        stolen = crud.Claimed(job.id, first.plan_id, "f" * 32, first.request, "cpu", 1)
        assert not crud.finish_job(
            session=session, claimed=stolen, result=None, summary=None, error=None
        )
        assert crud.finish_job(
            session=session, claimed=first, result={"id": "x"}, summary={}, error=None
        )
        assert session.get(PlanRecord, first.plan_id).status == "done"


def test_orphaned_jobs_are_requeued_then_failed(database):
    with database.session() as session:
        _, job = _queued(session)
    for attempt in (1, 2):
        with database.session() as session:
            assert crud.claim_job(session=session, job_id=job.id, worker="gone:1:x")
            session.execute(update(Job).values(heartbeat_at=utcnow() - timedelta(seconds=60)))
            session.commit()
            requeued, failed = crud.requeue_orphans(
                session=session,
                lease_s=30,
                max_attempts=2,
                interrupted=search_interrupted_body,
            )
        if attempt == 1:
            assert (requeued, failed) == (1, 0)
        else:
            assert (requeued, failed) == (0, 1)
    with database.session() as session:
        record = session.get(PlanRecord, job.plan_id)
        assert record.status == "failed" and "interrupted 2 times" in record.error["detail"]
        assert record.dedup_key is None  # the same request searches again


def test_released_jobs_do_not_count_as_attempts(database):
    with database.session() as session:
        _, job = _queued(session)
        claimed = crud.claim_job(session=session, job_id=job.id, worker="here:1:x")
        assert crud.release_jobs(session=session, claims=[claimed.claim]) == 1
        session.expire_all()
        stored = session.get(Job, job.id)
        assert stored.status == "queued" and stored.attempts == 0
        assert crud.queued_job_ids(session=session, limit=5) == [job.id]
        assert crud.queued_job_ids(session=session, limit=5, exclude=[job.id]) == []


def test_write_report_counts_one_revision_per_write(database):
    points = [
        LayerPoint(
            "cpu",
            "fp32",
            256,
            8,
            1024,
            128,
            mb,
            1,
            "none",
            False,
            False,
            1.0,
            1.0,
            None,
            None,
            True,
            "t",
        )
        for mb in (1, 2, 4)
    ]
    report = WriteReport()
    with database.session() as session:
        for point in points:
            upsert_layer_point(session=session, point=point, origin="api", report=report)
        session.commit()
    assert report.created == 3 and report.revisions == {"cpu": 2}


def test_migrating_copies_plan_measurements_into_measured_runs(empty_database_url):
    """A measurement reported for a plan before measured runs existed becomes a measured run
    of the plan's request and candidate when the schema moves on; the measurement itself
    stays as it was."""
    from alembic.script import ScriptDirectory

    from api.core.db import alembic_config

    before = ScriptDirectory.from_config(alembic_config()).get_revision("0004").down_revision
    database = Database(empty_database_url)
    try:
        migrate(database, str(before))
        request = PlanRequest.model_validate(example("tiny-cpu"))
        result = plan(request)
        _store_cpu_hardware(database)
        # Rows as that revision's schema has them (the models describe the newest).
        plans = sa_table(
            "plans",
            *(
                sa_column(name)
                for name in (
                    "id",
                    "request_hash",
                    "request",
                    "status",
                    "result",
                    "summary",
                    "error",
                    "warnings",
                    "model_name",
                    "gpu",
                    "num_gpus",
                    "method",
                    "hardware_revision",
                    "created_at",
                    "updated_at",
                    "finished_at",
                )
            ),
        )
        measurements = sa_table(
            "measurements",
            *(
                sa_column(name)
                for name in (
                    "plan_id",
                    "candidate",
                    "step_time_s",
                    "peak_activation_bytes",
                    "predicted_iteration_time_s",
                    "data",
                    "created_at",
                )
            ),
        )
        plan_id, now = "a" * 32, utcnow().replace(tzinfo=None)
        with database.engine.begin() as conn:
            conn.execute(
                plans.insert().values(
                    id=plan_id,
                    request_hash="h",
                    request=json.dumps(request.model_dump(mode="json")),
                    status="done",
                    result=result.model_dump_json(),
                    summary="null",
                    error="null",
                    warnings="[]",
                    model_name="tiny",
                    gpu="cpu",
                    num_gpus=request.cluster.num_gpus,
                    method="grid",
                    hardware_revision=1,
                    created_at=now,
                    updated_at=now,
                    finished_at=now,
                )
            )
            measurement_id = conn.execute(
                measurements.insert()
                .values(
                    plan_id=plan_id,
                    candidate=1,
                    step_time_s=0.25,
                    peak_activation_bytes="[]",
                    predicted_iteration_time_s=None,
                    data="{}",
                    created_at=now,
                )
                .returning(sa_column("id"))
            ).scalar_one()
        migrate(database, "head")
        with database.session() as session:
            (row,) = session.scalars(select(MeasuredRunRecord))
            run = MeasuredRun.model_validate(row.run)
            assert session.get(Measurement, measurement_id).step_time_s == 0.25
        assert (row.measurement_id, row.origin, row.gpu) == (measurement_id, "plan", "cpu")
        assert run.measured == StepMeasurement(step_time_s=0.25)
        assert run.model == request.model and run.training == request.training
        assert candidate_config(run) == result.candidates[1].config
        assert run.source == f"executor run of plan {plan_id}, candidate 1"
        assert row.fingerprint == fingerprint(run)
    finally:
        database.dispose()


def test_upgrading_a_filled_database_loses_no_row(empty_database_url):
    """A store with profiles, a plan, its job and a measurement, upgraded from the first
    revision to the newest: every row is still there (SQLite's batch migrations rebuild
    tables; with foreign keys on, dropping a parent would delete its children)."""
    database = Database(empty_database_url)
    tables = ("hardware", "comm_profiles", "layer_profiles", "plans", "jobs", "measurements")
    try:
        migrate(database, "0001")
        now = utcnow().replace(tzinfo=None)
        with database.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO hardware VALUES ('gpu-x', '', '{\"bf16\": 1e14}', 80, 76, 2000, "
                    "'', 'api', 3, :now, :now)"
                ),
                {"now": now},
            )
            for scope in ("intra_node", "inter_node"):
                conn.execute(
                    text(
                        "INSERT INTO comm_profiles (gpu, scope, kind, bandwidth_gbps, latency_us,"
                        " source, origin, updated_at) VALUES ('gpu-x', :s, 'k', 1, 1, '', 'api',"
                        " :now)"
                    ),
                    {"s": scope, "now": now},
                )
            conn.execute(
                text(
                    "INSERT INTO layer_profiles (gpu, precision, hidden_size, num_attention_heads,"
                    " ffn_hidden_size, seq_length, micro_batch_size, t, recompute,"
                    " sequence_parallel, flash_attention, forward_ms, backward_ms, weight_ms,"
                    " activation_bytes, includes_tp_comm, source, origin, created_at, updated_at)"
                    " VALUES ('gpu-x', 'bf16', 64, 2, 256, 16, 1, 1, 'none', false, false, 1, 2,"
                    " NULL, NULL, true, '', 'api', :now, :now)"
                ),
                {"now": now},
            )
            conn.execute(
                text(
                    "INSERT INTO plans VALUES ('p1', 'h', '{}', 'done', NULL, NULL, NULL, '[]',"
                    " 'm', 'gpu-x', 8, 'grid', 3, :now, :now, :now)"
                ),
                {"now": now},
            )
            conn.execute(
                text(
                    "INSERT INTO jobs (id, plan_id, kind, status, attempts, created_at)"
                    " VALUES ('j1', 'p1', 'plan', 'done', 1, :now)"
                ),
                {"now": now},
            )
            conn.execute(
                text(
                    "INSERT INTO measurements (plan_id, candidate, step_time_s,"
                    " peak_activation_bytes, predicted_iteration_time_s, data, created_at)"
                    " VALUES ('p1', 0, 1.5, '[]', NULL, '{}', :now)"
                ),
                {"now": now},
            )
        migrate(database, "head")
        with database.engine.connect() as conn:
            counts = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() for t in tables}
            dedup = conn.execute(text("SELECT dedup_key FROM plans")).scalar()
        assert counts == dict.fromkeys(tables, 1) | {"comm_profiles": 2}
        assert dedup == "h"  # the done plan keeps answering its request
    finally:
        database.dispose()


def test_runs_stored_before_withdrawing_existed_stay_in_use_and_survive_a_downgrade(
    empty_database_url,
):
    """Revision 0007 adds when and why a run was withdrawn: every run stored before it is in
    use; going back to 0006 keeps every run (and forgets only the withdrawals)."""
    from alembic import command

    from api.core.db import migration_connection
    from api.store.measured_runs import list_runs, withdraw_run

    database = Database(empty_database_url)
    try:
        migrate(database, "0006")
        _store_cpu_hardware(database)
        request = example("tiny-cpu")
        run = MeasuredRun.model_validate(
            {
                **{k: request[k] for k in ("model", "cluster", "training")},
                "config": {
                    "t": 1,
                    "p": 4,
                    "d": 1,
                    "micro_batch_size": 1,
                    "recompute": "none",
                    "schedule": "1f1b",
                },
                "measured": {"kind": "step", "step_time_s": 0.5},
                "source": "stored at 0006",
            }
        )
        runs = _insert_old_run(database, run, origin="cli")

        migrate(database, "head")
        with database.session() as session:
            (row,) = list_runs(session=session)
            assert (row.withdrawn_at, row.withdrawn_reason) == (None, None)
            assert row.fingerprint == fingerprint(run) and row.source == "stored at 0006"
            withdraw_run(session=session, run_id=row.id, reason="before the downgrade")
            session.commit()
            assert list_runs(session=session) == []

        with migration_connection(database) as conn, conn.begin():
            config = alembic_config()
            config.attributes["connection"] = conn
            command.downgrade(config, "0006")
        columns = {c["name"] for c in inspect(database.engine).get_columns("measured_runs")}
        assert "withdrawn_at" not in columns and "withdrawn_reason" not in columns
        with database.engine.connect() as conn:
            kept = conn.execute(select(runs.c.fingerprint, runs.c.source)).all()
        assert [tuple(r) for r in kept] == [(fingerprint(run), "stored at 0006")]

        migrate(database, "head")
        with database.session() as session:
            (row,) = list_runs(session=session)  # in use again: the withdrawal is forgotten
            assert row.withdrawn_at is None
    finally:
        database.dispose()


def _insert_old_run(database: Database, run: MeasuredRun, **columns: Any) -> Any:
    """Store ``run`` as a row of ``measured_runs`` as an older revision's schema has it
    (the models describe the newest); the table, as far as it was written."""
    from api.store.measured_runs import run_columns

    values = {
        **run_columns(run),
        "fingerprint": fingerprint(run),
        "created_at": utcnow().replace(tzinfo=None),
        **columns,
    }
    values["run"] = json.dumps(values["run"])
    values["peak_memory_gib"] = json.dumps(values["peak_memory_gib"])
    runs = sa_table("measured_runs", *(sa_column(name) for name in values))
    with database.engine.begin() as conn:
        conn.execute(runs.insert().values(**values))
    return runs


def test_plan_measurements_stored_before_0008_keep_their_run_and_survive_a_downgrade(
    empty_database_url,
):
    """Revision 0008 records, on a plan measurement, the measured run it was stored as
    (copied from the run's link back to it) and why the store refused one (unknown for a
    measurement stored before); going back to 0007 keeps every row."""
    from alembic import command

    from api.core.db import migration_connection

    database = Database(empty_database_url)
    try:
        migrate(database, "0007")
        _store_cpu_hardware(database)
        now = utcnow().replace(tzinfo=None)
        with database.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO plans (id, request_hash, request, status, warnings, model_name,"
                    " gpu, num_gpus, method, hardware_revision, created_at, updated_at)"
                    " VALUES ('p1', 'h', '{}', 'done', '[]', 'tiny', 'cpu', 4, 'grid', 1, :now,"
                    " :now)"
                ),
                {"now": now},
            )
            linked, unlinked = (
                conn.execute(
                    text(
                        "INSERT INTO measurements (plan_id, candidate, step_time_s,"
                        " peak_activation_bytes, predicted_iteration_time_s, data, created_at)"
                        " VALUES ('p1', 0, :step, '[]', 0.5, '{}', :now) RETURNING id"
                    ),
                    {"step": step, "now": now},
                ).scalar_one()
                for step in (0.5, 500.0)
            )
        run = MeasuredRun.model_validate({**RUN, "source": "executor run of plan p1, candidate 0"})
        runs = _insert_old_run(database, run, origin="plan", measurement_id=linked)
        with database.engine.connect() as conn:
            run_id = conn.execute(select(sa_column("id")).select_from(runs)).scalar_one()

        migrate(database, "head")
        with database.session() as session:
            stored = {m.id: m for m in session.scalars(select(Measurement))}
            recorded = {i: (m.measured_run_id, m.not_calibrated_because) for i, m in stored.items()}
            assert recorded == {linked: (run_id, None), unlinked: (None, None)}
            stored[unlinked].not_calibrated_because = "in ms"
            session.commit()

        with migration_connection(database) as conn, conn.begin():
            config = alembic_config()
            config.attributes["connection"] = conn
            command.downgrade(config, "0007")
        columns = {c["name"] for c in inspect(database.engine).get_columns("measurements")}
        assert not {"measured_run_id", "not_calibrated_because"} & columns
        with database.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM measurements")).scalar() == 2
            link = conn.execute(text("SELECT id, measurement_id FROM measured_runs")).one()
        assert tuple(link) == (run_id, linked)

        migrate(database, "head")
        with database.session() as session:
            stored = {m.id: m for m in session.scalars(select(Measurement))}
            assert stored[linked].measured_run_id == run_id
            assert stored[unlinked].not_calibrated_because is None  # forgotten going back
    finally:
        database.dispose()


def _store_cpu_hardware(database: Database) -> None:
    """The bundled cpu profile in a store migrated to an older revision, which the bundled
    loader (written for the newest schema) cannot fill."""
    with database.session() as session:
        upsert_hardware(
            session=session,
            profile=JsonProfileStore.load().hardware("cpu"),
            origin="bundled",
            report=WriteReport(),
        )
        session.commit()
