"""Reading and following a job's combined log by byte offset."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import Request

from cellscale.spec import LogChunk
from cellscale_hub.api.context import Context
from cellscale_hub.drivers import Driver
from cellscale_hub.store.models import Job

FOLLOW_POLL_SECONDS = 0.05
PHASE_CHECK_SECONDS = 0.5  # at the latest; soon after each controller cycle (at most every PHASE_RECHECK_SECONDS)
PHASE_RECHECK_SECONDS = 0.1
KEEPALIVE_SECONDS = 15.0


def _read(ctx: Context, driver: Driver, job_id: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """Whole lines from `offset`, and the log's size, through the job's driver."""
    return driver.read_log(ctx.jobs_root / job_id, offset, max_bytes)


def _terminal(ctx: Context, job_id: str) -> bool:
    with ctx.store.session() as session:
        job = session.get(Job, job_id)
        return job is None or job.phase.terminal


def read_chunk(ctx: Context, driver: Driver, job_id: str, offset: int, max_bytes: int) -> LogChunk:
    terminal = _terminal(ctx, job_id)
    data, size = _read(ctx, driver, job_id, offset, max_bytes)
    end = offset + len(data)
    return LogChunk(
        offset=offset, next_offset=end, text=data.decode(errors="replace"), complete=terminal and end >= size
    )


async def follow(ctx: Context, driver: Driver, job_id: str, offset: int, request: Request) -> AsyncIterator[str]:
    last_check = last_send = 0.0
    terminal, cycles = False, ctx.cycles()
    while True:
        data, size = _read(ctx, driver, job_id, offset, 2**20)
        now = time.monotonic()
        if data:
            chunk = LogChunk(
                offset=offset, next_offset=offset + len(data), text=data.decode(errors="replace"), complete=False
            )
            offset = chunk.next_offset
            last_send = now
            yield f"id: {offset}\ndata: {chunk.model_dump_json()}\n\n"
            continue
        if terminal and offset >= size:
            end = LogChunk(offset=offset, next_offset=offset, text="", complete=True)
            yield f"id: {offset}\nevent: end\ndata: {end.model_dump_json()}\n\n"
            return
        since = now - last_check
        if since > PHASE_CHECK_SECONDS or (ctx.cycles() != cycles and since > PHASE_RECHECK_SECONDS):
            last_check, cycles = now, ctx.cycles()
            terminal = await asyncio.to_thread(_terminal, ctx, job_id)
            if await request.is_disconnected():
                return
            continue  # re-read once more after seeing the job end, so no line is lost
        if now - last_send > KEEPALIVE_SECONDS:
            last_send = now
            yield ": keepalive\n\n"
        await asyncio.sleep(FOLLOW_POLL_SECONDS)
