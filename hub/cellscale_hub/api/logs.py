"""Reading and following a job's combined log by byte offset."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from cellscale.spec import LogChunk
from cellscale_hub.api.context import Context
from cellscale_hub.drivers import Driver
from cellscale_hub.store.models import Job

KEEPALIVE_SECONDS = 15.0


def _read(ctx: Context, driver: Driver, job_id: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """Whole lines from `offset`, and the log's size, through the job's driver."""
    return driver.files.read_log(ctx.jobs_root / job_id, offset, max_bytes)


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


async def follow(ctx: Context, driver: Driver, job_id: str, offset: int) -> AsyncIterator[str]:
    """Server-sent events of the log from `offset`: a chunk of whole lines whenever some are
    written, a keepalive comment after KEEPALIVE_SECONDS without one, and an `end` event once
    the job ended and everything was sent. A follower waiting for its job's next line does
    nothing until `LogWatch` wakes it. A client that goes away cancels it (StreamingResponse
    listens for the disconnect), and it leaves the watch."""
    with ctx.log_watch.follow(job_id, driver, ctx.jobs_root / job_id) as log:
        if await asyncio.to_thread(_terminal, ctx, job_id):  # asked once it watches: a later end is announced
            log.end()
        keepalive_at = time.monotonic() + KEEPALIVE_SECONDS
        while True:
            seen, ended = log.version, log.ended  # before the read: what the job wrote before it ended is read
            data, size = _read(ctx, driver, job_id, offset, 2**20)
            if data:
                chunk = LogChunk(
                    offset=offset, next_offset=offset + len(data), text=data.decode(errors="replace"), complete=False
                )
                offset = chunk.next_offset
                keepalive_at = time.monotonic() + KEEPALIVE_SECONDS
                yield f"id: {offset}\ndata: {chunk.model_dump_json()}\n\n"
            elif ended and offset >= size:
                end = LogChunk(offset=offset, next_offset=offset, text="", complete=True)
                yield f"id: {offset}\nevent: end\ndata: {end.model_dump_json()}\n\n"
                return
            elif not await log.wait(seen, keepalive_at - time.monotonic()):
                keepalive_at = time.monotonic() + KEEPALIVE_SECONDS
                yield ": keepalive\n\n"
