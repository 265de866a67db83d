"""What a job is called where people see it: by where it came from.

A job has two names. `JobSpec.name` is a slug (`[A-Za-z0-9._-]`, 63 characters at most): what
`--name` sets, what `GET /api/jobs?name=` and the panel's search match. `JobSpec.title` is how
the notebook, the panel and the command line show it: the notebook and the cell
(`train.ipynb [12]`), the cell's first meaningful line in a terminal IPython, the file a
`cellscale submit` ran, a Dagster asset and its partition. Neither ever reaches a backend's
script: Slurm's job names are the job id and attempt.
"""

from __future__ import annotations

import os
import re
from pathlib import PurePath

from cellscale.spec import MAX_TITLE_CHARS, Origin

FIRST_LINE_CHARS = 60
"""Longest first line of a cell a title keeps (longer: cut, with …)."""
NOTEBOOK_CHARS = 100
"""Longest notebook file name a title keeps."""

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]+")
_NOT_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
_SKIPPED = ("#", "import ", "from ", "%", "!")


def printable(text: str, limit: int = MAX_TITLE_CHARS) -> str:
    """`text` as one line of printable text of at most `limit` characters: control, line-break and
    bidi characters become spaces, runs of spaces one, a longer text is cut with …."""
    line = " ".join(_UNPRINTABLE.sub(" ", text).split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def first_line(source: str) -> str | None:
    """The cell's first meaningful line: not blank, a comment, an import or a magic."""
    for line in source.splitlines():
        words = printable(line, FIRST_LINE_CHARS)
        if words and not words.startswith(_SKIPPED):
            return words
    return None


def cell_title(shell, source: str) -> str | None:
    """A cell's title: in a notebook (JupyterLab gives the kernel its path, `JPY_SESSION_NAME`,
    which ipykernel keeps as `__session__`) its file name and the cell's execution count,
    `train.ipynb [12]`; elsewhere its first meaningful line."""
    session = shell.user_ns.get("__session__") or os.environ.get("JPY_SESSION_NAME")
    if isinstance(session, str) and printable(PurePath(session).name):
        return f"{printable(PurePath(session).name, NOTEBOOK_CHARS)} [{cell_number(shell, source)}]"
    return first_line(source)


def cell_number(shell, source: str) -> int:
    """The running cell's In [N]. IPython 9 counts a cell it keeps in its history before running
    it (`execution_count` is then N + 1, and the history's newest entry is this cell); earlier
    versions count after, and a cell not kept (`store_history=False`) is not counted."""
    count, body = shell.execution_count, source.strip()
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    if body and history is not None and len(history) == count > 1 and body in history[-1]:
        return count - 1
    return count


def origin_title(origin: Origin) -> str:
    """A workflow's job: its asset (or step) and partition, `daily_model [2026-11-30]`,
    `daily_model [30 partitions from 2026-11-01]`."""
    what = origin.asset or origin.step or f"{origin.tool} run {origin.run_id[:8]}"
    if origin.partition_count == 1 and origin.partitions:
        what += f" [{origin.partitions[0]}]"
    elif origin.partition_count > 1:
        first = f" from {origin.partitions[0]}" if origin.partitions else ""
        what += f" [{origin.partition_count} partitions{first}]"
    return printable(what)


def slug(title: str | None) -> str | None:
    """The name a title makes (`train.ipynb [12]` → `train.ipynb-12`); None when nothing is left."""
    if not title:
        return None
    name = _NOT_SLUG.sub("-", title).strip("._-")[:63].rstrip("-")
    return name or None
