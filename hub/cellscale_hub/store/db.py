"""Engine, schema migration and sessions. SQLite (WAL) by default; PostgreSQL in production."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from cellscale_hub.store import totals

MIGRATIONS = Path(__file__).with_name("migrations")
ENDED = "cellscale.ended_jobs"  # session.info key: the jobs this session moved to a terminal phase
WROTE = "cellscale.wrote"  # session.info key: this session wrote something (flushed, or ran an INSERT/UPDATE/DELETE)

log = logging.getLogger("cellscale.store")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


class Store:
    """Owns the engine; hands out sessions that commit on success and roll back on error."""

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        totals.keep_on_commit(self._sessions)
        self._end_listeners: list[Callable[[str], None]] = []
        self.changes = 0
        """Bumped after each commit of this process that wrote something: what a reader read after
        taking its value stays true while the value stays the same (the controller's idle cycles
        read nothing again). Bumped after the commit, so a reader that sees the new value sees
        what was written."""
        self._changes_lock = threading.Lock()
        event.listen(self._sessions, "after_flush", _note_write)
        event.listen(self._sessions, "do_orm_execute", _note_statement)
        event.listen(self._sessions, "after_commit", self._count_change)
        event.listen(self._sessions, "after_rollback", lambda session: session.info.pop(WROTE, None))

    def migrate(self) -> None:
        """Bring the schema to the newest revision (safe to call on every start)."""
        command.upgrade(alembic_config(self.engine), "head")

    def on_job_end(self, listener: Callable[[str], None]) -> None:
        """Call `listener(job_id)` after each commit that moved a job to a terminal phase, in
        the committing thread (the controller's, or a request's): how the log followers learn
        that a job ended without asking the store. It must be quick and must not raise."""
        self._end_listeners.append(listener)

    def _count_change(self, session: Session) -> None:
        if session.info.pop(WROTE, False):
            with self._changes_lock:  # never lost, never back to a value a reader kept
                self.changes += 1

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions.begin() as session:
            yield session
        for job_id in session.info.pop(ENDED, ()):
            for listener in self._end_listeners:
                try:
                    listener(job_id)
                except Exception:  # the commit stands; a listener's fault is its own
                    log.exception("a listener for the end of job %s failed", job_id)

    def dispose(self) -> None:
        self.engine.dispose()


def _note_write(session: Session, _flush_context) -> None:
    session.info[WROTE] = True


def _note_statement(state) -> None:
    if state.is_insert or state.is_update or state.is_delete:
        state.session.info[WROTE] = True
