"""Telling log followers when to read: one watch per followed job, shared by all its followers.

A follower reads its job's log when the log changed or the job ended, and otherwise waits
without doing anything. Three things wake a followed log:

- inotify (Linux): the kernel reports each write to the log made on this host, at once;
- a check of the log's size every `Driver.log_poll_interval` per followed job (not per
  follower), for what other hosts append to a shared filesystem, which inotify does not see
  (every 0.05 s where inotify is unavailable, as on macOS, or past the watch limit);
- the store's announcement that a commit moved the job to a terminal phase
  (`Store.on_job_end`), so no follower asks the store whether its job is over.

The watch of a job starts with its first follower and stops with its last: a control plane
that nobody follows a log of has no inotify instance and no timer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cellscale_hub.drivers import Driver
from cellscale_hub.inotify import IN_DELETE_SELF, IN_IGNORED, IN_MOVE_SELF, OVERFLOW, Inotify
from cellscale_hub.store import Store

log = logging.getLogger("cellscale.logs")

UNWATCHED_POLL_SECONDS = 0.05
"""How often a followed log that inotify does not watch is checked."""

GONE = IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF


class FollowedLog:
    """One job's log as its followers see it: a version that moves on each change that may
    hold new lines, and whether the job ended."""

    def __init__(self, job_id: str, driver: Driver, job_dir: Path):
        self.job_id, self.driver, self.job_dir = job_id, driver, job_dir
        self.path = driver.files.log_path(job_dir)
        self.followers = 0
        self.version = 0
        self.ended = False
        self.size = driver.files.log_size(job_dir)
        self.wd: int | None = None  # the inotify watch on the log's directory, or on the nearest one above it
        self.watching: Path | None = None
        self.poller: asyncio.Task | None = None
        self._changed = asyncio.Event()

    def changed(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def end(self) -> None:
        self.ended = True
        self.changed()

    async def wait(self, seen: int, timeout: float) -> bool:
        """Until the log changes after `version` was `seen`: True, or False after `timeout` s."""
        if self.version != seen:
            return True
        try:
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        except TimeoutError:
            return False
        return True


class LogWatch:
    """The followed logs of one control plane (its `Context` holds it)."""

    def __init__(self, store: Store):
        self._loops: dict[asyncio.AbstractEventLoop, _LoopWatch] = {}
        store.on_job_end(self._job_ended)

    @contextmanager
    def follow(self, job_id: str, driver: Driver, job_dir: Path) -> Iterator[FollowedLog]:
        """The job's log for one follower, while the `with` lasts (an ended or cancelled
        follower leaves it, and the last one stops its watch)."""
        loop = asyncio.get_running_loop()
        watch = self._loops.get(loop) or self._loops.setdefault(loop, _LoopWatch(loop))
        followed = watch.join(job_id, driver, job_dir)
        try:
            yield followed
        finally:
            watch.leave(followed)
            if not watch.logs:
                watch.close()
                del self._loops[loop]

    def followers(self) -> dict[str, int]:
        """How many followers each followed job has now."""
        watches = list(self._loops.values())  # copies: another thread may ask
        return {job: followed.followers for watch in watches for job, followed in list(watch.logs.items())}

    def _job_ended(self, job_id: str) -> None:
        """From the thread that committed the end (Store.on_job_end)."""
        for loop, watch in list(self._loops.items()):
            if job_id in watch.logs:
                try:
                    loop.call_soon_threadsafe(watch.ended, job_id)
                except RuntimeError:  # that loop is closed: nobody is left there to tell
                    pass


class _LoopWatch:
    """The logs followed from one event loop (the server's; a test client has its own)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.logs: dict[str, FollowedLog] = {}
        self._by_wd: dict[int, set[FollowedLog]] = {}
        self._refused = False  # a watch was refused (the user's watch limit): said once
        self._inotify = _open_inotify()
        if self._inotify:
            loop.add_reader(self._inotify.fd, self._on_events)

    def join(self, job_id: str, driver: Driver, job_dir: Path) -> FollowedLog:
        followed = self.logs.get(job_id)
        if followed is None:
            followed = self.logs[job_id] = FollowedLog(job_id, driver, job_dir)
            self._arm(followed)
            followed.poller = self.loop.create_task(self._poll(followed), name=f"log check {job_id}")
        followed.followers += 1
        return followed

    def leave(self, followed: FollowedLog) -> None:
        followed.followers -= 1
        if followed.followers == 0:
            del self.logs[followed.job_id]
            followed.poller.cancel()
            self._disarm(followed)

    def ended(self, job_id: str) -> None:
        if job_id in self.logs:
            self.logs[job_id].end()

    def close(self) -> None:
        if self._inotify:
            self.loop.remove_reader(self._inotify.fd)
            self._inotify.close()

    # -- inotify -------------------------------------------------------------------------
    def _arm(self, followed: FollowedLog) -> None:
        """Watch the log's directory; while it does not exist yet (a job not started), the
        nearest directory above it that does, whose change re-arms."""
        if not self._inotify or followed.path is None:
            return
        directory = followed.path.parent
        for target in (directory, *directory.parents):
            if target == followed.watching or self._watch(followed, target):
                break
        if followed.watching != directory:
            self._watch(followed, directory)  # made between the two tries: its creation went unreported

    def _watch(self, followed: FollowedLog, directory: Path) -> bool:
        try:
            wd = self._inotify.watch(directory)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:  # the user's watch limit (ENOSPC), or no permission: checked often instead
            if not self._refused:
                self._refused = True
                log.warning(
                    "cannot watch %s (%s): logs without a watch are checked every %s s",
                    directory,
                    exc,
                    UNWATCHED_POLL_SECONDS,
                )
            return True
        self._disarm(followed)
        followed.wd, followed.watching = wd, directory
        self._by_wd.setdefault(wd, set()).add(followed)
        return True

    def _disarm(self, followed: FollowedLog) -> None:
        if followed.wd is None:
            return
        sharing = self._by_wd.get(followed.wd, set())
        sharing.discard(followed)
        if not sharing:
            self._by_wd.pop(followed.wd, None)
            self._inotify.unwatch(followed.wd)
        followed.wd = followed.watching = None

    def _on_events(self) -> None:
        for wd, mask, name in self._inotify.read():
            if wd == OVERFLOW:
                for followed in self.logs.values():
                    followed.changed()
                continue
            for followed in list(self._by_wd.get(wd, ())):
                self._on_event(followed, mask, name)

    def _on_event(self, followed: FollowedLog, mask: int, name: str) -> None:
        if mask & GONE:  # the directory went away (or its watch did): watch what is there now
            self._by_wd.pop(followed.wd, None)
            followed.wd = followed.watching = None
            self._arm(followed)
            followed.changed()
        elif followed.watching != followed.path.parent:  # something appeared on the way to the log
            self._arm(followed)
            if followed.watching == followed.path.parent:  # the log may be there already
                followed.changed()
        elif name == followed.path.name:
            followed.changed()

    # -- the size check --------------------------------------------------------------------
    async def _poll(self, followed: FollowedLog) -> None:
        """Check the log's size every `log_poll_interval`, for the writes no event reports;
        every UNWATCHED_POLL_SECONDS while inotify cannot watch it."""
        while True:
            unwatched = followed.path is not None and followed.watching is None
            await asyncio.sleep(UNWATCHED_POLL_SECONDS if unwatched else followed.driver.log_poll_interval)
            if unwatched:
                self._arm(followed)
            size = followed.driver.files.log_size(followed.job_dir)
            if size != followed.size:
                followed.size = size
                followed.changed()


def _open_inotify() -> Inotify | None:
    try:
        return Inotify()
    except OSError as exc:  # not Linux, or the user's inotify instances are used up
        log.warning("no inotify (%s): each followed log is checked every %s s", exc, UNWATCHED_POLL_SECONDS)
        return None
