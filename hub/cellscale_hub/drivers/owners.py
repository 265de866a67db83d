"""The job's owner: every job runs as its researcher's Unix user. The privilege step that
starts a command as them (`as_user`), and, when the control plane runs as root, handing
them the job directory and the files written into it after."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from cellscale_hub.drivers.types import SpecRejected
from cellscale_hub.proc import UNIX_USER


def as_user(prefix: list[str], user: str) -> list[str]:
    """The privilege step that runs a command as the job's owner (`runuser -u {user} --` as
    root, `sudo -n -u {user} --` in production), with the validated user name filled in."""
    if not UNIX_USER.match(user):
        raise SpecRejected(f"user name {user!r} is not a valid Unix user name; jobs run as their owner")
    return [part.replace("{user}", user) for part in prefix]


def hand_to_owner(user: str, job_dir: Path) -> None:
    """As root, give the job directory to the user who runs the job, readable by them alone
    (desk-mates read it through the API, which checks). Not root: nothing to do (the control
    plane and its jobs share one Unix user)."""
    if os.geteuid() != 0:
        return
    hand_files_to_owner(user, [job_dir, *job_dir.rglob("*")])
    job_dir.chmod(0o700)


def owner_of(path: Path) -> str | None:
    """The user name owning `path` (None: gone, or a uid with no name)."""
    try:
        return pwd.getpwuid(path.stat().st_uid).pw_name
    except (KeyError, OSError):
        return None


def hand_files_to_owner(user: str, paths: list[Path]) -> None:
    """As root, give these files (written since the job directory was handed over) to the job's
    user; not root: nothing to do."""
    if os.geteuid() != 0:
        return
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise RuntimeError(f"there is no Unix user {user!r} on this machine; jobs run as their owner") from None
    for path in paths:
        os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
