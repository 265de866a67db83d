"""The server extension's one client of the control plane: plain calls, and a followed log.

Answers are read as the kernel's own client reads them (cellscale.wire): the same server-sent
log events parser, giving LogChunk models, and the same error sentence.

Every call carries the server's own hub token, so the control plane sees the server's user
(JupyterHub mints it with `Spawner.server_token_scopes`). Paths are built only from constants
and validated job ids; query values go through httpx's encoding, never into a string we build.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping

import httpx

from cellscale.spec import LogChunk
from cellscale.wire import LogEvents, error_detail

JOB_ID = re.compile(r"^cs-[0-9a-f]{12}$")
RECONNECT_DELAYS_S = (0.5, 1, 2, 4, 8)
"""How long the log follower waits before each reconnect to the control plane; it gives up after the last."""


class ControlPlaneError(Exception):
    """The control plane answered with an error status (`status`, `body` as it sent it), or
    could not be reached (status 502)."""

    def __init__(self, status: int, body: bytes, detail: str):
        super().__init__(detail)
        self.status, self.body, self.detail = status, body, detail


def check_job_id(job_id: str) -> str:
    if not JOB_ID.match(job_id):
        raise ValueError(f"{job_id[:40]!r} is not a cellscale job id (cs- and 12 hex digits)")
    return job_id


def _unreachable(exc: httpx.HTTPError) -> ControlPlaneError:
    detail = f"cannot reach the control plane: {type(exc).__name__}: {exc}"
    return ControlPlaneError(502, json.dumps({"detail": detail}).encode(), detail)


class ControlPlaneClient:
    def __init__(
        self, url: str, token: str, timeout_s: float = 10.0, transport: httpx.AsyncBaseTransport | None = None
    ):
        self.url = url
        self._client = httpx.AsyncClient(
            base_url=url.rstrip("/") + "/",
            timeout=timeout_s,
            transport=transport,
            headers={"Authorization": f"token {token}"},
        )

    async def request(self, method: str, path: str, params: Mapping[str, str] | None = None) -> httpx.Response:
        """`path` is relative to the control plane's root (`api/jobs`); any status comes back."""
        try:
            return await self._client.request(method, path, params=dict(params or {}))
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from exc

    async def get_json(self, path: str, params: Mapping[str, str] | None = None):
        response = await self.request("GET", path, params)
        if response.status_code != 200:
            status, body = response.status_code, response.content
            raise ControlPlaneError(status, body, error_detail(status, body))
        return response.json()

    async def follow_logs(self, job_id: str, offset: int) -> AsyncIterator[LogChunk]:
        """The job's log from byte `offset` as LogChunks, live, until the control plane says
        it is complete (the last chunk has `complete: true`). A dropped stream is resumed
        from the last offset (Last-Event-ID), after RECONNECT_DELAYS_S."""
        check_job_id(job_id)
        failures = 0
        while True:
            try:
                async for chunk in self._stream(job_id, offset):
                    failures = 0
                    offset = chunk.next_offset
                    yield chunk
                    if chunk.complete:
                        return
            except httpx.HTTPError as exc:
                if failures >= len(RECONNECT_DELAYS_S):
                    raise _unreachable(exc) from exc
            else:
                if failures >= len(RECONNECT_DELAYS_S):
                    raise ControlPlaneError(502, b"", "the control plane keeps closing the log stream")
            await asyncio.sleep(RECONNECT_DELAYS_S[failures])
            failures += 1

    async def _stream(self, job_id: str, offset: int) -> AsyncIterator[LogChunk]:
        """One server-sent-events request; yields each event's LogChunk until the stream ends."""
        timeout = httpx.Timeout(10.0, read=60.0)  # the control plane sends a keepalive every 15 s
        async with self._client.stream(
            "GET",
            f"api/jobs/{job_id}/logs",
            params={"offset": offset, "follow": "true"},
            headers={"Last-Event-ID": str(offset), "Accept": "text/event-stream"},
            timeout=timeout,
        ) as response:
            if response.status_code != 200:
                body = await response.aread()
                raise ControlPlaneError(response.status_code, body, error_detail(response.status_code, body))
            events = LogEvents()
            async for line in response.aiter_lines():
                chunk = events.feed(line)
                if chunk is not None:
                    yield chunk

    async def aclose(self) -> None:
        await self._client.aclose()
