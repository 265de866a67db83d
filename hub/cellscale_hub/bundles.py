"""Input bundles: the pickled notebook variables a job ships (`%%cluster --inputs df,lr`).

A bundle is opaque bytes to the control plane (never unpickled here), content-addressed and
kept per owner: a user's job can use only a bundle that user uploaded, or one another user
shared with them explicitly, so knowing a hash (a desk-mate sees it in the job's spec) is not
enough. Each user's bundles are bounded in bytes, and a bundle no waiting or running job
refers to is removed once it is older than a grace period (the time between an upload and
its submit). Layout: `<root>/<owner>/<sha256>`, directories 0700, owned by the control plane.
The controller runs `sweep_bundles` every `bundle_sweep_s`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from cellscale_hub.store import Store
from cellscale_hub.store import jobs as q
from cellscale_hub.store.models import utcnow

log = logging.getLogger("cellscale.bundles")

SAFE_OWNER = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class BundleRefused(ValueError):
    """The bundle cannot be stored or used; the message says why and what to do."""


@dataclass(frozen=True)
class Stored:
    sha256: str
    size: int


class BundleStore:
    def __init__(self, root: Path, quota_bytes: int, grace_s: float):
        self.root = root
        self.quota_bytes = quota_bytes
        self.grace_s = grace_s

    def put(self, owner: str, data: bytes) -> Stored:
        """Store `data` for `owner` (idempotent), within the owner's quota."""
        sha = hashlib.sha256(data).hexdigest()
        path = self._path(owner, sha)
        if path.exists():
            os.utime(path)  # uploaded again: its grace period starts again
            return Stored(sha, len(data))
        used = self.used(owner)
        if used + len(data) > self.quota_bytes:
            raise BundleRefused(
                f"your input bundles would take {_mib(used + len(data))} MiB, more than the {_mib(self.quota_bytes)} "
                "MiB each user may keep; bundles no waiting or running job uses are removed after "
                f"{self.grace_s / 3600:g} h (or ship big data by URL)"
            )
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{sha}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        return Stored(sha, len(data))

    def path(self, owner: str, sha: str) -> Path | None:
        """The bundle `owner` may use, or None (never uploaded by them nor shared with them)."""
        if not SHA256.match(sha):
            return None
        path = self._path(owner, sha)
        return path if path.is_file() else None

    def share(self, owner: str, sha: str, with_user: str) -> None:
        """Let `with_user` use one of `owner`'s bundles (a hard link: no copy; it counts
        against both users' quotas while both keep it)."""
        source = self.path(owner, sha)
        if source is None:
            raise BundleRefused(f"you have no input bundle {sha}; upload it first")
        target = self._path(with_user, sha)
        if target.exists():
            return
        if self.used(with_user) + source.stat().st_size > self.quota_bytes:
            raise BundleRefused(f"{with_user}'s input bundles would exceed {_mib(self.quota_bytes)} MiB")
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.link(source, target)

    def used(self, owner: str) -> int:
        folder = self.root / _folder(owner)
        try:
            return sum(entry.stat().st_size for entry in folder.iterdir() if entry.is_file())
        except FileNotFoundError:
            return 0

    def sweep(self, referenced: Mapping[str, set[str]], now: float | None = None) -> int:
        """Remove bundles that no waiting or running job refers to (`referenced`: owner →
        hashes) and that are older than the grace period. Returns how many were removed."""
        now = time.time() if now is None else now
        keep = {_folder(owner): hashes for owner, hashes in referenced.items()}
        removed = 0
        for folder in self.root.iterdir() if self.root.exists() else ():
            for entry in folder.iterdir() if folder.is_dir() else ():
                stale = now - entry.stat().st_mtime > self.grace_s
                if stale and entry.name not in keep.get(folder.name, set()):
                    entry.unlink(missing_ok=True)
                    removed += 1
        return removed

    def _path(self, owner: str, sha: str) -> Path:
        return self.root / _folder(owner) / sha


def sweep_bundles(store: Store, bundles: BundleStore, keep_succeeded_s: float) -> None:
    """Remove input bundles no waiting or running job uses (nor one that succeeded lately),
    once past their grace period."""
    since = utcnow() - timedelta(seconds=keep_succeeded_s) if keep_succeeded_s else None
    with store.session() as session:
        in_use = q.bundles_in_use(session, since)
    removed = bundles.sweep(in_use)
    if removed:
        log.info("removed %d input bundle(s) no job uses any more", removed)


def _folder(owner: str) -> str:
    """The owner's folder name: the user name when it is a plain one, else a digest of it."""
    return owner if SAFE_OWNER.match(owner) else "u-" + hashlib.sha256(owner.encode()).hexdigest()[:32]


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f}"
