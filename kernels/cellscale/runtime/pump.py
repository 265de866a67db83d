"""Copy a child's output into the job log, line by line, with a prefix."""

from __future__ import annotations

import threading
from typing import IO

from cellscale.runtime.jobdir import append_line


def pump_lines(stream: IO[bytes], log_fd: int, prefix: str) -> threading.Thread:
    """Start a thread that appends each line of `stream` to the log as it arrives."""
    tag = prefix.encode()

    def run() -> None:
        for line in iter(stream.readline, b""):
            append_line(log_fd, tag, line)
        stream.close()

    thread = threading.Thread(target=run, name=f"pump{prefix}", daemon=True)
    thread.start()
    return thread
