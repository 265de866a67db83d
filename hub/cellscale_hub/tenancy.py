"""Tenants (desks) and their LocalQueues, as data.

A tenant is a JupyterHub group; a user belongs to the tenants whose groups they are in.
Each tenant submits to named LocalQueues, each bound to a backend. The file looks like:

    tenants:
      desk-a:
        queues:
          default: {backend: local}
      desk-b:
        queues:
          default: {backend: local}
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, Field

DEFAULT_QUEUE = "default"


class QueueConfig(BaseModel):
    backend: str


class TenantConfig(BaseModel):
    queues: dict[str, QueueConfig] = Field(default_factory=lambda: {DEFAULT_QUEUE: QueueConfig(backend="local")})


class Tenancy(BaseModel):
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> "Tenancy":
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})

    @classmethod
    def single(cls, tenant: str, backend: str) -> "Tenancy":
        return cls(tenants={tenant: TenantConfig(queues={DEFAULT_QUEUE: QueueConfig(backend=backend)})})

    def tenants_of(self, groups: list[str]) -> list[str]:
        return sorted(group for group in groups if group in self.tenants)

    def resolve_queue(self, tenant: str, queue: str | None) -> tuple[str, QueueConfig]:
        """The queue a job of `tenant` lands in; a ValueError names the valid choices."""
        queues = self.tenants[tenant].queues
        name = queue or (DEFAULT_QUEUE if DEFAULT_QUEUE in queues else next(iter(queues)))
        if name not in queues:
            raise ValueError(f"tenant {tenant!r} has no queue {name!r}; its queues are: {', '.join(sorted(queues))}")
        return name, queues[name]
