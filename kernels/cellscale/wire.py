"""Reading the control plane's answers the same way in every client, and wording its refusals.

- `LogEvents` / `log_chunks`: the one parser of the followed log (GET /api/jobs/ID/logs?follow=true,
  server-sent events) into LogChunk models. The kernel's Client (sync httpx) and the server
  extension's relay (async httpx) feed it the lines they read.
- `error_detail`: an HTTP error answer → the sentence to show. The control plane always answers
  `{"detail": "<one sentence>"}`, validation errors included (cellscale_hub.api.errors).
- `FLAGS`, `spec_field`, `explain`: a refused JobSpec field → the `%%cluster` flag that sets it,
  so the magic (checking before it sends) and the control plane (checking what any client sent)
  say the same thing.

Light on purpose (pydantic and cellscale.spec only): the server extension imports it too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence

from pydantic import ValidationError

from cellscale.spec import LogChunk

# -- the followed log ----------------------------------------------------------------------


class LogEvents:
    """Server-sent events → LogChunks, fed one line at a time (without its line ending).

    An event ends at a blank line; its `data:` lines, joined by newlines, are one LogChunk's
    JSON. `: keepalive` comments and `id:` lines (which repeat next_offset) are skipped; an
    `event: end` chunk is the last (complete). Events of other types are ignored.
    """

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""

    def feed(self, line: str) -> LogChunk | None:
        """The chunk that `line` completes, if it completes one."""
        if not line:
            data, event = self._data, self._event
            self._data, self._event = [], ""
            if not data or event not in ("", "message", "end"):
                return None
            chunk = LogChunk.model_validate_json("\n".join(data))
            return chunk.model_copy(update={"complete": True}) if event == "end" else chunk
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        return None


def log_chunks(lines: Iterable[str]) -> Iterator[LogChunk]:
    """The LogChunks of a server-sent-event stream's lines; an event cut off by the end of
    the stream (no blank line after it) is dropped."""
    events = LogEvents()
    for line in lines:
        chunk = events.feed(line)
        if chunk is not None:
            yield chunk


# -- error answers -------------------------------------------------------------------------


def error_detail(status: int, body: bytes | str) -> str:
    """The sentence an HTTP error answer carries: its JSON `detail` when that is a string (the
    control plane's always is), else the start of its text (a proxy's error page, say)."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    try:
        detail = json.loads(text).get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, str) and detail:
        return detail
    text = " ".join(text.split())[:300]
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


# -- validation errors, in %%cluster terms ---------------------------------------------------

FLAGS: dict[str, str] = {
    "name": "--name",
    "launcher": "--launcher",
    "resources.nodes": "--nodes",
    "resources.gpus_per_node": "--gpus-per-node",
    "resources.tasks_per_node": "--tasks-per-node",
    "resources.cpus_per_task": "--cpus",
    "resources.memory_mb_per_node": "--mem",
    "resources.timeout_min": "--time",
    "resources.switches": "--switches",
    "queue": "--queue",
    "backend": "--backend",
    "site": "--site",
    "burst": "--burst",
    "datasets": "--data",
    "data_mode": "--data-mode",
    "priority": "--priority",
    "retries.infrastructure": "--retries",
    "retries.timeout": "--retries-timeout",
    "retries.user_error": "--retries-user",
    "stall_timeout_s": "--stall-timeout",
    "env": "--env",
    "input_names": "--inputs",
    "outputs": "--outputs",
    "sweep.points": "--over",
    "sweep.max_parallel": "--max-parallel",
    "sweep.per_task": "--per-task",
}
"""JobSpec field (dotted path) → the `%%cluster` flag that sets it (cellscale.magicargs)."""


def spec_field(loc: Sequence) -> str:
    """What to call JobSpec field `loc` (pydantic's error location, relative to the JobSpec):
    the flag that sets it (its own or its nearest parent's: `env.KEY` → `--env`), else its
    dotted path; "" for the spec as a whole."""
    path = [str(part) for part in loc]
    for end in range(len(path), 0, -1):
        flag = FLAGS.get(".".join(path[:end]))
        if flag:
            return flag
    return ".".join(path)


def clause(where: str, error: Mapping) -> str:
    """One pydantic error as `where: message` (pydantic's "Value error, " prefix dropped)."""
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


SPEC_PARTS: dict[str, tuple[str, ...]] = {
    "JobSpec": (),
    "Resources": ("resources",),
    "Retries": ("retries",),
    "Sweep": ("sweep",),
}
"""The models a JobSpec is made of (a ValidationError's title), and where each sits in it."""


def explain(exc: ValidationError) -> str:
    """A JobSpec's (or one of its parts') validation errors as one sentence that names the
    flags to change."""
    prefix = SPEC_PARTS.get(exc.title, ())
    return "; ".join(clause(spec_field((*prefix, *error["loc"])), error) for error in exc.errors())
