"""The tenancy in force, kept in the database: seeded from config/tenants.yaml into an
empty database, then changed only through `TenancyBook.change` (the admin API), which
validates the whole new document and records who changed what, before and after."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cellscale_hub.store.db import Store
from cellscale_hub.store.models import AuditEvent, TenancyRevision, utcnow
from cellscale_hub.tenancy import Tenancy


class TenancyBook:
    """The current Tenancy, cached; every change is a new revision plus an audit event."""

    def __init__(self, store: Store):
        self.store = store
        self._lock = threading.Lock()
        self._current: tuple[int, Tenancy] | None = None

    def seed(self, tenancy: Tenancy, actor: str, replace: bool = False) -> None:
        """Store `tenancy` if the database has none (or, with `replace`, as a new revision)."""
        with self.store.session() as session:
            latest = _latest(session)
            if latest is not None and (not replace or latest.document == _doc(tenancy)):
                return
            before = latest.document if latest is not None else None
            _record(session, actor, "seed", "tenancy", before, _doc(tenancy))
        self._current = None

    @property
    def current(self) -> Tenancy:
        return self._load()[1]

    @property
    def revision(self) -> int:
        """Changes whenever the tenancy does (the id of the revision in force)."""
        return self._load()[0]

    def _load(self) -> tuple[int, Tenancy]:
        cached = self._current
        if cached is not None:
            return cached
        with self.store.session() as session:
            latest = _latest(session)
            if latest is None:
                raise RuntimeError("no tenancy stored: seed it first")
            self._current = (latest.id, Tenancy.model_validate(latest.document))
        return self._current

    def change(self, actor: str, action: str, target: str, edit: Callable[[dict], tuple[Any, Any]]) -> Tenancy:
        """Apply `edit` to a copy of the document; it returns (before, after) of what it
        changed. The result must validate as a whole, or nothing is stored (ValueError)."""
        with self._lock, self.store.session() as session:
            latest = _latest(session)
            document = Tenancy.model_validate(latest.document).model_dump(mode="json")
            before, after = edit(document)
            tenancy = Tenancy.model_validate(document)  # raises ValidationError (a ValueError)
            _record(session, actor, action, target, before, after, document=_doc(tenancy))
            self._current = None
        return self.current

    def audit(self, limit: int = 200) -> list[AuditEvent]:
        with self.store.session() as session:
            query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
            return list(session.scalars(query))


def _doc(tenancy: Tenancy) -> dict:
    return tenancy.model_dump(mode="json")


def _latest(session: Session) -> TenancyRevision | None:
    return session.scalar(select(TenancyRevision).order_by(TenancyRevision.id.desc()).limit(1))


def _record(
    session: Session, actor: str, action: str, target: str, before, after, document: dict | None = None
) -> None:
    revision = TenancyRevision(at=utcnow(), actor=actor, document=document if document is not None else after)
    session.add(revision)
    session.flush()
    session.add(
        AuditEvent(
            at=utcnow(),
            actor=actor,
            action=action,
            target=target,
            before=_wrap(before),
            after=_wrap(after),
            revision=revision.id,
        )
    )


def _wrap(value) -> dict | None:
    """JSON columns hold objects; a bare number is kept as {"value": n}."""
    return value if value is None or isinstance(value, dict) else {"value": value}
