"""Reading and following a job's combined log by byte offset."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import Request

from cellscale.spec import LogChunk, Phase
from cellscale_hub.api.context import Context
from cellscale_hub.store.models import Job

FOLLOW_POLL_SECONDS = 0.05
PHASE_CHECK_SECONDS = 0.5
KEEPALIVE_SECONDS = 15.0


def _read(ctx: Context, job_id: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """Whole lines from `offset` (a partial last line waits for its newline), and the file size."""
    path = ctx.jobs_root / job_id / "output.log"
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(max_bytes)
            size = handle.seek(0, 2)
    except FileNotFoundError:
        return b"", 0
    cut = data.rfind(b"\n") + 1
    if cut == 0 and len(data) < max_bytes:
        return b"", size
    return (data[:cut] if cut else data), size


def _terminal(ctx: Context, job_id: str) -> bool:
    with ctx.store.session() as session:
        job = session.get(Job, job_id)
        return job is None or Phase(job.phase).terminal


def read_chunk(ctx: Context, job_id: str, offset: int, max_bytes: int) -> LogChunk:
    terminal = _terminal(ctx, job_id)
    data, size = _read(ctx, job_id, offset, max_bytes)
    end = offset + len(data)
    return LogChunk(offset=offset, next_offset=end, text=data.decode(errors="replace"), complete=terminal and end >= size)


async def follow(ctx: Context, job_id: str, offset: int, request: Request) -> AsyncIterator[str]:
    last_check = last_send = 0.0
    terminal = False
    while True:
        data, size = _read(ctx, job_id, offset, 2**20)
        now = time.monotonic()
        if data:
            chunk = LogChunk(offset=offset, next_offset=offset + len(data), text=data.decode(errors="replace"), complete=False)
            offset = chunk.next_offset
            last_send = now
            yield f"id: {offset}\ndata: {chunk.model_dump_json()}\n\n"
            continue
        if terminal and offset >= size:
            end = LogChunk(offset=offset, next_offset=offset, text="", complete=True)
            yield f"id: {offset}\nevent: end\ndata: {end.model_dump_json()}\n\n"
            return
        if now - last_check > PHASE_CHECK_SECONDS:
            last_check = now
            terminal = await asyncio.to_thread(_terminal, ctx, job_id)
            if await request.is_disconnected():
                return
            continue  # re-read once more after seeing the job end, so no line is lost
        if now - last_send > KEEPALIVE_SECONDS:
            last_send = now
            yield ": keepalive\n\n"
        await asyncio.sleep(FOLLOW_POLL_SECONDS)
