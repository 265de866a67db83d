"""The constrained types and bounds every part of the wire contract is built from: names,
hashes, the largest safe integer, and the strict base model of every request."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_NAME_CHARS = 128
"""Longest variable or environment variable name."""

MAX_SAFE_INT = 2**53 - 1
"""Largest integer every client reads exactly from JSON (JavaScript's Number.MAX_SAFE_INTEGER):
the bound of the offsets and ids a client sends back (log offsets, event ids)."""

RESULT_TAG_HEADER = "X-Cellscale-Result-Tag"
"""The response header of GET /api/jobs/ID/result carrying the job's HMAC of its outputs."""

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
QueueName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ErrorBody(BaseModel):
    """Every refusal of the control plane (4xx), validation errors included."""

    detail: str = Field(description="One sentence: what was refused and what to change.")
