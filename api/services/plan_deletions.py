"""Plan deletions made by any server process, pushed to this one by PostgreSQL.

A done plan never changes; only deleting it does. Each server process keeps done plans'
answers in memory (:class:`api.services.cache.PerPlanCache`) and must stop serving one as
soon as the plan is deleted, by whichever process. PostgreSQL sends a notice on the channel
:data:`CHANNEL` for every deleted plan row (a trigger, migration 0006; delivered when the
deleting transaction commits). :class:`DeletionFeed` listens on a connection of its own, on
a thread of its own, and hands each deleted plan's id to ``forget``.

While the feed is :attr:`~DeletionFeed.live` a cached answer is served without asking the
database; otherwise (SQLite, the feed's connection lost or silent) each cached read checks
that the plan is still stored (:func:`plan_exists`). What that costs and buys:

- a plan deleted by another process may be served here for as long as the notice takes to
  arrive (milliseconds on a healthy server; the notice is sent at commit, the deleting
  client's DELETE answers after it), and up to :data:`SILENT_AFTER_S` if the feed's
  connection stalls unnoticed;
- the feed proves it hears: every second it sends a probe notice on the channel (every
  process sees the others' probes and ignores them) and is live only while one of its own
  probes sent within :data:`SILENT_AFTER_S` has come back. PostgreSQL delivers a
  listener's notices in commit order, so when a probe sent at time T is back, every
  deletion committed before T has been forgotten. A lost connection makes the feed not
  live at once, a silent one within that bound; through a connection pooler (the server
  process answering is not the one connected to) it never goes live. Reads then check the
  database;
- when the feed (re)connects, everything cached is forgotten before it goes live again:
  deletions made while it was not listening were not heard.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from api.core.db import Database
from api.store.models import PlanRecord

__all__ = ["CHANNEL", "SILENT_AFTER_S", "DeletionFeed", "plan_exists"]

log = logging.getLogger("stagewright.deletions")

CHANNEL = "stagewright_plan_deleted"  # also in migrations/versions/0006
_LISTEN = f"LISTEN {CHANNEL}"
_PROBE = "probe:"  # a probe's payload starts so; a deleted plan's is its id (hex)
_EVERY_PLAN = "*"  # TRUNCATE plans
HEARTBEAT_S = 1.0
_STOP_CHECK_S = 0.1  # longest a shutdown waits for a listener that is waiting for notices
# Not live when no probe sent within this long has come back: longer than the pauses a
# loaded server shows (up to 1.4 s seen on this project's load benchmark), short enough that
# a stalled feed is not trusted for long.
SILENT_AFTER_S = 5.0
_RETRY_S = (0.5, 5.0)  # first and longest wait before reconnecting


class DeletionFeed:
    """Listens for deleted plans (PostgreSQL) and calls ``forget(plan_id)`` for each, and
    ``forget(None)`` (forget everything) whenever it starts listening. Never live on SQLite.
    """

    def __init__(self, database: Database, forget: Callable[[str | None], None]) -> None:
        self._database = database
        self._forget = forget
        self._heard_at: float | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def live(self) -> bool:
        """Listening, and its last probe back was sent within :data:`SILENT_AFTER_S`."""
        heard = self._heard_at
        return heard is not None and time.monotonic() - heard < SILENT_AFTER_S

    def start(self) -> None:
        if self._database.dialect != "postgresql" or self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._listen, name="stagewright-plan-deletions", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop listening: the listener sees the stop within :data:`_STOP_CHECK_S` while it
        waits for notices; waits at most a heartbeat and a little for the thread (one held
        up by an unresponsive database)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(HEARTBEAT_S + 1.0)

    def _listen(self) -> None:
        wait = _RETRY_S[0]
        reported = ""
        while not self._stopping.is_set():
            try:
                with self._database.dedicated_connection("stagewright plan deletions") as conn:
                    wait = _RETRY_S[0]
                    self._hear(conn)
            except Exception as exc:
                self._heard_at = None
                if self._stopping.is_set():
                    return
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if reason != reported:  # once per cause, not every retry
                    log.warning(
                        "not listening for plan deletions (%s); cached plans are checked "
                        "against the database meanwhile",
                        reason,
                    )
                    reported = reason
                self._stopping.wait(wait)
                wait = min(2 * wait, _RETRY_S[1])
        self._heard_at = None

    def _hear(self, conn: Any) -> None:
        """LISTEN on ``conn``, then probe and apply what it hears until stopped; raises when
        the connection fails or does not reach one server process."""
        conn.execute(_LISTEN)
        self._forget(None)  # deletions made while not listening were not heard
        connected_to = conn.info.backend_pid
        sent: dict[str, float] = {}  # probes not back yet -> when each was sent
        while not self._stopping.is_set():
            probe, sent_at = f"{_PROBE}{uuid.uuid4().hex}", time.monotonic()
            row = conn.execute(
                "SELECT pg_backend_pid(), pg_notify(%s, %s)", (CHANNEL, probe)
            ).fetchone()
            if row[0] != connected_to:
                # A pooler between (PgBouncer): notices reach whichever client holds the
                # server process that LISTENed, so hearing cannot be trusted.
                raise ConnectionError(
                    "the connection goes through a pooler (server process "
                    f"{row[0]} answered, {connected_to} was connected to); the feed needs a "
                    "direct connection to PostgreSQL"
                )
            sent[probe] = sent_at
            # Until the next heartbeat, in slices short enough that a shutdown is not kept
            # waiting (notices arriving between slices wait in the socket for the next).
            next_probe = sent_at + HEARTBEAT_S
            while not self._stopping.is_set() and (left := next_probe - time.monotonic()) > 0:
                for notice in conn.notifies(timeout=min(left, _STOP_CHECK_S)):
                    self._apply(notice.payload, sent)
            stale = time.monotonic() - SILENT_AFTER_S
            sent = {p: at for p, at in sent.items() if at >= stale}

    def _apply(self, payload: str, sent: dict[str, float]) -> None:
        """One notice: a probe of ours back (``sent`` holds those not back yet), every plan
        deleted, one plan deleted, or another process's probe."""
        if payload in sent:
            # Notices arrive in commit order: every deletion committed before this probe
            # was sent has been applied (a late probe counts as well).
            self._heard_at = max(self._heard_at or 0.0, sent.pop(payload))
        elif payload == _EVERY_PLAN:
            self._forget(None)
        elif not payload.startswith(_PROBE):  # another process's probe: ignored
            self._forget(payload)


def plan_exists(database: Database, plan_id: str) -> bool:
    """Whether the plan is still stored. On PostgreSQL the lookup runs outside a
    transaction (autocommit): one round trip instead of BEGIN, SELECT and ROLLBACK."""
    statement = select(PlanRecord.id).where(PlanRecord.id == plan_id)
    if database.dialect == "postgresql":
        with database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return conn.execute(statement).first() is not None
    with database.session() as session:
        return session.execute(statement).first() is not None
