"""`stagewright profiles load` and `stagewright serve` as operators run them."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import os
import socket
import time

import httpx
import pytest
from sqlalchemy.engine import make_url

from api.core.config import Settings, SettingsError
from api.core.db import Database, normalize_url, wait_for_database
from api.service import _log_config
from cli.main import main
from planner.profiles import default_store
from tests.integration.conftest import PG_ADMIN_URL, example, free_port


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_profiles_load_is_idempotent(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    code, out, _ = run(capsys, "profiles", "load", "--database-url", url)
    assert code == 0 and out == (
        "profiles: 21 created, 0 updated, 0 unchanged; measured runs: 48 added, 0 already stored\n"
    )
    code, out, _ = run(capsys, "profiles", "load", "--database-url", url)
    assert code == 0 and out == (
        "profiles: 0 created, 0 updated, 21 unchanged; measured runs: 0 added, 48 already stored\n"
    )


def test_profiles_load_on_postgresql(postgres_schema, capsys):
    from tests.integration.conftest import schema_url

    url = schema_url(postgres_schema)
    for _ in range(2):
        code, out, _ = run(capsys, "profiles", "load", "--database-url", url)
        assert code == 0 and "0 updated" in out


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--database-url", "nonsense"], {}, "is not a database URL; use sqlite:///"),
        (["--database-url", "mysql://u@h/db"], {}, "'mysql' is not supported"),
        (["--database-url", "sqlite:///no/such/folder/x.db"], {}, "does not exist; create it"),
        (["--database-url", "sqlite://"], {}, "in-memory SQLite"),
        # A driver name with a typo was SQLAlchemy's NoSuchModuleError traceback.
        (["--database-url", "sqlite+pysqlit:///x.db"], {}, "no driver 'pysqlit' for sqlite"),
        ([], {"STAGEWRIGHT_PLANNER_THREADS": "many"}, "STAGEWRIGHT_PLANNER_THREADS='many'"),
        ([], {"STAGEWRIGHT_MAX_BODY_BYTES": "10"}, "greater than or equal to 1024"),
        # Accepted before, then broke at run time: the job poller failed on every round (a
        # lease beyond any date) or died (a wait the clock cannot express), so jobs left
        # queued or orphaned never ran again; a memory limit past the kernel's failed every search
        # as "it may have run out of memory".
        ([], {"STAGEWRIGHT_JOB_LEASE_S": "inf"}, "STAGEWRIGHT_JOB_LEASE_S='inf': Input should"),
        ([], {"STAGEWRIGHT_JOB_POLL_S": "1e12"}, "less than or equal to 3600"),
        ([], {"STAGEWRIGHT_JOB_POLL_S": "1e-9"}, "greater than or equal to 0.01"),
        ([], {"STAGEWRIGHT_JOB_MEMORY_MB": "99999999999999"}, "less than or equal to 16777216"),
        (["--port", "70000"], {}, "--port 70000 is not a port"),
        (["--workers", "0"], {}, "--workers must be at least 1"),
    ],
)
def test_serve_reports_bad_settings_in_one_line(monkeypatch, capsys, tmp_path, args, env, needle):
    monkeypatch.chdir(tmp_path)  # a setting accepted by mistake must not serve from the checkout
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # A free port first (a case's own --port comes later and wins): the database URL is
    # checked after the address, and another server may hold the default 8000.
    code, out, err = run(capsys, "serve", "--port", str(free_port()), *args)
    assert code == 2 and out == ""
    assert err.startswith("stagewright serve: error: ") and err.count("\n") == 1
    assert needle in err


@pytest.mark.parametrize("command", [["profiles", "load"], ["measurements", "list"]])
def test_a_database_url_naming_no_sqlite_file_is_one_line(tmp_path, capsys, command):
    """--database-url sqlite:///request.json (any file not SQLite's) was a DatabaseError
    traceback ("file is not a database"); a folder was "cannot reach the database ...
    check that it is running"."""
    request = tmp_path / "request.json"
    request.write_text(json.dumps(example("tiny-cpu")))
    before = request.read_bytes()
    code, out, err = run(capsys, *command, "--database-url", f"sqlite:///{request}")
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert f"{request} is not an SQLite database" in err
    assert request.read_bytes() == before
    code, out, err = run(capsys, *command, "--database-url", f"sqlite:///{tmp_path}")
    assert code == 2 and err.count("\n") == 1
    assert f"{tmp_path} is a folder, not an SQLite file" in err


@pytest.mark.parametrize(
    ("tokens", "needle"),
    [
        ("xyzzy", "STAGEWRIGHT_API_TOKENS entry 1 (it has no ':'): write name:scopes:secret"),
        ("ci:fly:xyzzy", "STAGEWRIGHT_API_TOKENS entry 'ci': the name is letters"),
        ("ci:write:xyzzy; ci:read:b", "STAGEWRIGHT_API_TOKENS: token name(s) ci given twice"),
    ],
)
def test_serve_refuses_bad_tokens_before_touching_the_database(
    monkeypatch, capsys, tmp_path, tokens, needle
):
    """A malformed STAGEWRIGHT_API_TOKENS was found by the application in the server
    process: after the database was migrated and "stagewright serving on ..." printed."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STAGEWRIGHT_API_TOKENS", tokens)
    database = tmp_path / "never.db"
    code, out, err = run(capsys, "serve", "--database-url", f"sqlite:///{database}")
    assert code == 2 and out == ""
    assert err.startswith("stagewright serve: error: ") and err.count("\n") == 1
    assert needle in err and "xyzzy" not in err  # the secret is not shown
    assert not database.exists() and list(tmp_path.iterdir()) == []


def test_serve_that_cannot_listen_says_so_before_touching_the_database(
    monkeypatch, capsys, tmp_path
):
    """A port in use or a --host that does not resolve: serve migrated the database and
    printed "stagewright serving on http://..." first, then uvicorn's "ERROR: [Errno 98]
    ..." or "[Errno -2] Name or service not known", and exited with status 1 or 3."""
    monkeypatch.chdir(tmp_path)
    database = tmp_path / "never.db"
    url = f"sqlite:///{database}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, out, err = run(capsys, "serve", "--port", port, "--database-url", url)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "choose another --port" in err
    code, out, err = run(capsys, "serve", "--host", "no-such-host.invalid", "--database-url", url)
    assert code == 2 and err.count("\n") == 1, err
    assert "--host no-such-host.invalid does not resolve" in err
    assert not database.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        # "" binds every interface: an unset $HOST in `--host "$HOST"` exposed the service.
        (["--host", ""], "--host is empty; use 127.0.0.1"),
        (["--host", " "], "--host is empty; use 127.0.0.1"),
        # Each process starts its search processes and database pool: 100,000 of them
        # took the machine down.
        (["--workers", "100000"], "--workers 100000 is more server processes than"),
    ],
)
def test_serve_refuses_a_host_or_workers_no_one_means(monkeypatch, capsys, tmp_path, args, needle):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "serve", *args, "--database-url", f"sqlite:///{tmp_path}/n.db")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert needle in err
    assert list(tmp_path.iterdir()) == []


def test_serve_warns_of_a_variable_that_names_no_setting(monkeypatch, capsys, tmp_path):
    """A misspelt STAGEWRIGHT_MAX_GPUSS used to leave max_gpus at its default without a word.
    (Bad tokens then stop serve before the database: the warning is printed first.)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STAGEWRIGHT_MAX_GPUSS", "5")
    monkeypatch.setenv("STAGEWRIGHT_API_TOKENS", "xyzzy")
    code, _, err = run(capsys, "serve", "--database-url", f"sqlite:///{tmp_path / 'x.db'}")
    assert code == 2
    assert err.splitlines()[0] == (
        "stagewright serve: warning: STAGEWRIGHT_MAX_GPUSS is not a stagewright setting "
        "(did you mean STAGEWRIGHT_MAX_GPUS?); it is ignored"
    )
    assert Settings.unknown_variables({"STAGEWRIGHT_MAX_GPUS": "5", "OTHER": "x"}) == []
    assert Settings.unknown_variables(
        {"STAGEWRIGHT_PROFILES": "a", "STAGEWRIGHT_QQQQQQQQQQQQQQQQQQQQ": "1"}
    ) == ["STAGEWRIGHT_QQQQQQQQQQQQQQQQQQQQ is not a stagewright setting; it is ignored"]
    # Only what follows the shared prefix is compared: no setting resembles a log level.
    assert Settings.unknown_variables({"STAGEWRIGHT_LOG_LEVEL": "debug"}) == [
        "STAGEWRIGHT_LOG_LEVEL is not a stagewright setting; it is ignored"
    ]


def test_the_test_suites_own_variables_are_not_warned_of():
    """The executor failure tests mark their worker processes with STAGEWRIGHT_TEST_MARK
    (tests/executor/test_failures.py); a shell that exported it must not be told it is a
    misspelt setting."""
    assert Settings.unknown_variables({"STAGEWRIGHT_TEST_MARK": "m"}) == []


def test_unreachable_postgres_is_reported_after_the_wait(monkeypatch, capsys):
    monkeypatch.setenv("STAGEWRIGHT_DATABASE_WAIT_S", "0")
    url = "postgresql://nobody:secret@127.0.0.1:1/none"
    code, _, err = run(capsys, "profiles", "load", "--database-url", url)
    assert code == 2
    assert "cannot reach the database at postgresql" in err
    assert "://nobody:***@127.0.0.1:1/none (" in err
    assert "secret" not in err and "check that it is running" in err


def _timed(capsys, *args: str) -> tuple[int, str, float]:
    started = time.monotonic()
    code, _, err = run(capsys, *args)
    return code, err, time.monotonic() - started


def test_a_database_that_refuses_us_is_said_at_once(monkeypatch, capsys, postgres_schema):
    """A database or role that does not exist on a server that answers was retried for
    STAGEWRIGHT_DATABASE_WAIT_S (30 s) as if the server were still starting, then
    reported as "cannot reach the database ... check that it is running"."""
    monkeypatch.setenv("STAGEWRIGHT_DATABASE_WAIT_S", "30")
    url = make_url(PG_ADMIN_URL)
    for wrong, says in (
        (url.set(database="sw_no_such_database"), 'database "sw_no_such_database" does not'),
        (url.set(username="sw_no_such_role"), 'role "sw_no_such_role" does not exist'),
    ):
        text = wrong.render_as_string(hide_password=False)
        code, err, took = _timed(capsys, "profiles", "load", "--database-url", text)
        assert code == 2 and err.count("\n") == 1, err
        assert took < 10, took
        assert "refused the connection" in err and says in err
        assert "check that it is running" not in err


def test_a_sqlite_file_that_cannot_be_opened_is_said_at_once(monkeypatch, capsys, tmp_path):
    """An SQLite file SQLite cannot open (here a name longer than the file system takes;
    a read-only folder or file does the same) was retried for 30 s, then "cannot reach the
    database ... check that it is running": SQLite has no server to wait for."""
    monkeypatch.setenv("STAGEWRIGHT_DATABASE_WAIT_S", "30")
    path = tmp_path / ("x" * 300 + ".db")
    code, err, took = _timed(capsys, "profiles", "load", "--database-url", f"sqlite:///{path}")
    assert code == 2 and err.count("\n") == 1, err
    assert took < 10, took
    assert "cannot open the SQLite file" in err and "File name too long" in err
    # Past the checks of the path, the wait itself does not wait for a file.
    database = Database(f"sqlite:///{path}")
    started = time.monotonic()
    with pytest.raises(SettingsError, match="cannot open the SQLite file .*; check that this"):
        wait_for_database(database, 30)
    assert time.monotonic() - started < 10
    database.dispose()


def test_a_sqlite_folder_this_user_cannot_write_is_named(monkeypatch, capsys, tmp_path):
    """A read-only folder (a volume mounted read-only, or owned by another user): SQLite
    must create its -wal and -shm files there. (Faked: the tests may run as root.)"""
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real_access(p, mode)
    )
    code, _, err = run(capsys, "profiles", "load", "--database-url", f"sqlite:///{tmp_path}/a.db")
    assert code == 2 and err.count("\n") == 1
    assert f"the folder {tmp_path} is not writable by this user" in err
    assert not (tmp_path / "a.db").exists()


def test_a_full_disk_under_the_store_is_one_line_and_stores_nothing(tmp_path):
    """`measurements add` onto an SQLite file whose file system is full (here: a file size
    limit, as `ulimit -f` sets) ended in SQLAlchemy's "disk I/O error" traceback."""
    import resource
    import sqlite3
    import subprocess
    import sys

    from tests.integration.conftest import REPO

    url = f"sqlite:///{tmp_path / 'full.db'}"
    assert main(["profiles", "load", "--database-url", url]) == 0
    bundled = json.loads((REPO / "profiles/measurements/a100-sxm-80g-public.json").read_text())
    runs = bundled["runs"] if isinstance(bundled, dict) else bundled
    more = []
    for copy in range(4):
        for run_ in runs:
            changed = json.loads(json.dumps(run_))
            changed["source"] = (f"{changed.get('source', '')} copy {copy} " + "x" * 1500)[:1990]
            more.append(changed)
    added = tmp_path / "more.json"
    added.write_text(json.dumps({"runs": more}))
    limit = (tmp_path / "full.db").stat().st_size + 8192

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "measurements",
            "add",
            str(added),
            "--database-url",
            url,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=small_disk,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1, done.stderr
    assert "disk I/O error" in done.stderr and "free space" in done.stderr
    with sqlite3.connect(tmp_path / "full.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert db.execute("SELECT count(*) FROM measured_runs").fetchone() == (len(runs),)


def test_more_connections_than_postgresql_allows_are_warned_of(postgres_schema, tmp_path):
    """--workers 5 with the default 16 request threads may open 125 connections; a
    PostgreSQL with the default max_connections (100) then refused some under load with
    "too many clients already", which the service could only answer as "the database is
    unreachable" (503). serve now says so when it starts."""
    from api.service import connection_budget_warning
    from tests.integration.conftest import schema_url

    settings = Settings(database_url=schema_url(postgres_schema))
    database = Database(settings.database_url)
    try:
        with database.engine.connect() as conn:
            limit = int(conn.exec_driver_sql("SHOW max_connections").scalar_one())
        workers = limit // 25 + 1
        warning = connection_budget_warning(database, settings, workers)
        assert warning is not None
        assert f"{workers} server process(es) may open up to {workers * 25} connections" in warning
        assert f"max_connections is {limit}" in warning
        assert "lower --workers or STAGEWRIGHT_REQUEST_THREADS" in warning
        assert connection_budget_warning(database, settings, 1) is None
    finally:
        database.dispose()
    sqlite = Database(f"sqlite:///{tmp_path / 'x.db'}")
    assert connection_budget_warning(sqlite, settings, 1000) is None
    sqlite.dispose()


def test_settings_from_the_environment():
    settings = Settings.from_env(
        {"STAGEWRIGHT_PLAN_WAIT_S": "0.5", "STAGEWRIGHT_API_TOKEN": " ", "OTHER": "x"},
        database_url="sqlite:///a.db",
    )
    assert settings.plan_wait_s == 0.5 and settings.api_token is None
    assert settings.database_url == "sqlite:///a.db"
    assert "token" not in repr(Settings(api_token="abc"))
    with pytest.raises(SettingsError, match="STAGEWRIGHT_JOB_LEASE_S='-1'"):
        Settings.from_env({"STAGEWRIGHT_JOB_LEASE_S": "-1"})
    assert Settings.from_env(Settings(max_top_k=7).to_env()).max_top_k == 7
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+psycopg"


def test_serve_runs_the_service_on_the_embedded_default(tmp_path, start_server):
    """`stagewright serve` from a clean folder: migrates, loads, serves, plans."""
    server = start_server(f"sqlite:///{tmp_path / 'served.db'}")
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.get("/healthz").json()["database"] == "sqlite"
        assert len(http.get("/v1/hardware").json()) == 7
        response = http.post("/v1/plans", json=example("tiny-cpu"))
        assert response.status_code == 201 and response.json()["best"]
    text = server.log_path.read_text()
    assert f"stagewright serving on {server.url}" in text


def test_two_server_processes_share_one_store(tmp_path, start_server):
    """`serve --workers 2`: both processes answer, plan, and see each other's plans."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.integration.conftest import tiny

    server = start_server(f"sqlite:///{tmp_path / 'two.db'}", workers=2)

    def submit(batch: int) -> tuple[int, str]:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            # Waits long enough for 16 searches on two shared cores (latency is not the point).
            response = http.post(
                "/v1/plans",
                params={"wait_s": 30},
                json=tiny(**{"training.global_batch_size": batch}),
            )
            return response.status_code, response.json()["id"]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(submit, range(16, 48, 2)))
    assert {status for status, _ in results} == {201}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.get("/v1/plans", params={"limit": 100}).json()["total"] == len(results)
        for _, plan_id in results:
            assert http.get(f"/v1/plans/{plan_id}").json()["status"] == "done"


def test_a_pool_connection_that_cannot_be_reset_is_one_warning_line():
    """Killed database backends make SQLAlchemy's pool fail to reset a returned connection;
    it logs that with a traceback and discards the connection. The service's logging says
    it in one warning line instead (the reliability test that kills backends under load
    found the traceback in the server log)."""
    config = _log_config()
    stream = io.StringIO()
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": config["formatters"],
            "filters": config["filters"],
            "handlers": {"database": {**config["handlers"]["database"], "stream": stream}},
            "loggers": {"sqlalchemy.pool": config["loggers"]["sqlalchemy.pool"]},
        }
    )
    pool_logger = logging.getLogger("sqlalchemy.pool.impl.QueuePool")
    try:
        try:
            raise OSError("sending query failed: another command is already in progress")
        except OSError:
            pool_logger.error("Exception during reset or similar", exc_info=True)
        pool_logger.warning("Pool timeout")  # anything else passes unchanged
    finally:
        parent = logging.getLogger("sqlalchemy.pool")
        parent.handlers.clear()
        parent.propagate, parent.level = True, logging.NOTSET
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "Traceback" not in stream.getvalue()
    assert lines[0].startswith("WARNING")
    assert "could not be reset on return; discarded: sending query failed" in lines[0]
    assert "Pool timeout" in lines[1]


def test_regress_with_a_stores_profiles(tmp_path, capsys):
    """`regress` priced every scenario with the bundled profiles only: a profile a team
    added (POST /v1/hardware) or fitted (`stagewright calibrate`) could not be checked, and
    an unknown GPU named neither the scenario nor where such a profile lives."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.core.db import Database
    from api.store.profiles import WriteReport, upsert_hardware
    from cli.regress import BASELINE_FORMAT
    from planner.profiles import hardware_from_dict
    from tests.integration.conftest import settings_for
    from tests.integration.test_api_profiles import H200X

    url = f"sqlite:///{tmp_path / 'team.db'}"
    assert run(capsys, "profiles", "load", "--database-url", url)[0] == 0  # migrates it
    with TestClient(create_app(settings_for(url))) as client:
        assert client.post("/v1/hardware", json=H200X).status_code == 201
    request = example("tiny-cpu")
    request["cluster"]["gpu"] = H200X["name"]
    request["training"]["precision"] = "bf16"
    baseline = tmp_path / "baseline.json"
    baseline.write_text(
        json.dumps({"format": BASELINE_FORMAT, "scenarios": [{"name": "ours", "request": request}]})
    )

    code, _, err = run(capsys, "regress", str(baseline))
    assert code == 2 and "scenario 'ours': unknown GPU 'h200x-test'" in err
    assert "give --database-url" in err

    assert run(capsys, "regress", str(baseline), "--update", "--database-url", url)[0] == 0
    recorded = json.loads(baseline.read_text())["scenarios"][0]["expected"]
    plan_path = tmp_path / "request.json"
    plan_path.write_text(json.dumps(request))
    code, out, _ = run(capsys, "plan", str(plan_path), "--json", "--database-url", url)
    assert code == 0
    assert recorded["samples_per_s"] == json.loads(out)["best"]["predicted"]["samples_per_s"]
    code, out, _ = run(capsys, "regress", str(baseline), "--database-url", url)
    assert code == 0 and "all 1 scenarios within tolerance" in out

    # The team's profile changes (a recalibration finds the device half as fast): the check
    # against that store fails as slower.
    halved = {
        "peak_flops": {"bf16": 0.5e15, "fp32": 3.0e13},
        "memory_bandwidth_gbps": 2400,
        "intra_node": {"kind": "nvlink4", "bandwidth_gbps": 225, "latency_us": 6},
        "inter_node": {"kind": "infiniband-ndr", "bandwidth_gbps": 25, "latency_us": 10},
    }
    slower = hardware_from_dict({**H200X, **halved})
    database = Database(url)
    try:
        with database.session() as session:
            upsert_hardware(session=session, profile=slower, origin="api", report=WriteReport())
            session.commit()
    finally:
        database.dispose()
    code, out, _ = run(capsys, "regress", str(baseline), "--database-url", url, "--json")
    (outcome,) = json.loads(out)["scenarios"]
    assert code == 1 and outcome["status"] == "slower", outcome


def _lab_folder(folder, *, point_gpu: str = "lab-a100", name: str = "lab-a100"):  # type: ignore[no-untyped-def]
    """A profile folder as a team writes one: a copy of the bundled A100 under its own
    name, and one measured layer point (the layers/ file `stagewright profile --out` writes)."""
    from planner.profiles import LayerPoint, hardware_to_dict, save_point

    bundled = default_store().hardware("a100-sxm-80g")
    (folder / "hardware.json").parent.mkdir(parents=True, exist_ok=True)
    entry = {**hardware_to_dict(bundled), "name": name, "description": "our lab's A100s"}
    (folder / "hardware.json").write_text(json.dumps({"hardware": [entry]}))
    point = LayerPoint(
        gpu=point_gpu,
        precision="bf16",
        hidden_size=1024,
        num_attention_heads=16,
        ffn_hidden_size=4096,
        seq_length=2048,
        micro_batch_size=1,
        t=1,
        recompute="none",
        sequence_parallel=False,
        flash_attention=False,
        forward_ms=3.0,
        backward_ms=6.0,
        weight_ms=None,
        activation_bytes=None,
        includes_tp_comm=True,
        source="our lab",
    )
    save_point(point, folder)
    return folder


def test_profiles_load_takes_a_teams_profile_folders(tmp_path, capsys):
    """A profile of the team's own hardware reached the store only through POST
    /v1/hardware (a running service): `stagewright calibrate` and `measurements add` of a
    CLI-only team refused its GPU as unknown."""
    from api.core.db import Database
    from api.store.profiles import get_hardware, list_layer_points

    url = f"sqlite:///{tmp_path / 'team.db'}"
    lab = _lab_folder(tmp_path / "lab")
    code, out, _ = run(capsys, "profiles", "load", str(lab), "--database-url", url)
    assert code == 0 and out.splitlines()[1] == (
        f"your profiles ({lab}): 2 created, 0 updated, 0 unchanged"
    )
    code, out, _ = run(capsys, "profiles", "load", str(lab), "--database-url", url)
    assert out.splitlines()[1].endswith("0 created, 0 updated, 2 unchanged")
    # A later load of the bundled profiles alone (as every `serve` does) keeps them.
    assert run(capsys, "profiles", "load", "--database-url", url)[0] == 0
    database = Database(url)
    try:
        with database.session() as session:
            row = get_hardware(session=session, name="lab-a100")
            assert row is not None and row.description == "our lab's A100s"
            points = list_layer_points(session=session, gpu="lab-a100")
            assert [(p.forward_ms, p.source) for p in points] == [(3.0, "our lab")]
    finally:
        database.dispose()
    # And plans priced with that store know the GPU.
    request = example("tiny-cpu")
    request["cluster"]["gpu"] = "lab-a100"
    (tmp_path / "r.json").write_text(json.dumps(request))
    assert run(capsys, "plan", str(tmp_path / "r.json"), "--database-url", url)[0] == 0


def test_profiles_load_of_a_folder_it_cannot_use_stores_nothing_of_it(tmp_path, capsys):
    from api.core.db import Database
    from api.store.profiles import get_hardware

    url = f"sqlite:///{tmp_path / 'team.db'}"
    # A layer point of a GPU defined nowhere: the whole folder is refused, its hardware too.
    orphan = _lab_folder(tmp_path / "orphan", point_gpu="ghost")
    code, out, err = run(capsys, "profiles", "load", str(orphan), "--database-url", url)
    assert code == 2 and "layer points of 'ghost'" in err and "hardware.json" in err
    # A hardware.json that does not parse: one line naming the file.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "hardware.json").write_text('{"hardware": [')
    code, _, err = run(capsys, "profiles", "load", str(broken), "--database-url", url)
    assert code == 2 and str(broken / "hardware.json") in err and err.count("\n") == 1
    # A folder that is not a profile folder is named before the store is touched; a
    # mistyped one is said not to be there (it read as a folder that holds nothing).
    code, _, err = run(capsys, "profiles", "load", str(tmp_path / "nowhere"), "--database-url", url)
    assert code == 2 and f"there is no folder {tmp_path / 'nowhere'};" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "profiles", "load", str(tmp_path / "empty"), "--database-url", url)
    assert code == 2 and "empty holds neither a hardware.json nor a layers/ folder" in err
    database = Database(url)
    try:
        with database.session() as session:
            assert get_hardware(session=session, name="lab-a100") is None
    finally:
        database.dispose()
