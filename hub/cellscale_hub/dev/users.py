"""`cellscale dev users NAME...`: the demo's researchers as real Unix users on this machine.

cellscale runs every user's server, kernels and jobs as that user's own Unix identity, so
the OS keeps users apart (one user's job cannot read or write another's job directory,
results, bundles or notebooks). On a dev box that needs the users to exist: this creates
them (home directories private: 0700) and lets them run this Python (a pyenv under /root
needs the directories above it traversable). A production site has its users already
(LDAP, SSSD) and installs cellscale on a shared path.

Needs root; idempotent.
"""

from __future__ import annotations

import argparse
import os
import pwd
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from cellscale_hub.proc import UNIX_USER

Log = Callable[[str], None]


def ensure_users(names: Iterable[str], log: Log = print) -> None:
    """Create each missing user (with a private home), and make existing homes private."""
    for name in names:
        if not UNIX_USER.match(name):
            raise ValueError(f"{name!r} is not a valid Unix user name (lower case letters, digits, _ and -)")
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True, capture_output=True)
            entry = pwd.getpwnam(name)
            log(f"created Unix user {name}")
        home = Path(entry.pw_dir)
        if home.is_dir() and home.stat().st_mode & 0o077:
            home.chmod(0o700)  # Debian's useradd leaves homes world-readable (UMASK 022)
            log(f"made {home} private (0700)")


def share_python(log: Log = print, python: Path = Path(sys.executable)) -> None:
    """Let the researchers' users run this Python (their servers, kernels and jobs start
    with it): give every directory above the real interpreter and the environment search
    permission (o+x: traverse, not list) where it lacks it."""
    for target in {python.resolve(), python.parent.parent}:
        for directory in reversed(target.parents if target.is_file() else [target, *target.parents]):
            mode = directory.stat().st_mode
            if not mode & stat.S_IXOTH:
                os.chmod(directory, mode | stat.S_IXOTH)
                log(f"made {directory} traversable (o+x) so researchers can run {python}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cellscale dev users", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", help="user names to create (or check)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("cellscale dev users: run as root (it creates Unix users)", file=sys.stderr)
        return 2
    try:
        ensure_users(args.names)
    except (ValueError, subprocess.CalledProcessError) as exc:
        print(f"cellscale dev users: {exc}", file=sys.stderr)
        return 2
    share_python()
    return 0


if __name__ == "__main__":
    sys.exit(main())
