"""A job's --env and what the OS lets one exec carry: the bounds, the check of the names and
values (JobSpec.env), and why a start would fail with E2BIG (`exec_refusal`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from cellscale.spec.fields import MAX_NAME_CHARS

MAX_ENV_VARS = 256
"""Most environment variables a job may set (--env)."""

MAX_ENV_BYTES = 64 * 1024
"""Most bytes of --env, every `KEY=VALUE` counted with its terminating NUL, as the OS counts it
(64 KiB: well inside one exec's limits, MAX_ARG_STRLEN and ARG_MAX, on every Linux)."""

MAX_ARG_STRLEN = 131072
"""Linux: the longest one argument or `KEY=VALUE` environment string of an exec may be, NUL
included; a longer one fails with E2BIG ("Argument list too long")."""

EXEC_RESERVE_BYTES = 64 * 1024
"""What an attempt adds to the job's --env when it starts its processes: cellscale's and the
scheduler's variables, the inherited environment, the launcher's arguments."""

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_ENV_PREFIXES = (
    "CELLSCALE_",
    "SLURM_",
    "CUDA_VISIBLE_DEVICES",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_",
    "JAX_COORDINATOR_ADDRESS",  # this and the next two: a jax job's coordinates
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
)

USER_SETTABLE_ENV = frozenset({"CELLSCALE_SIMULATED_GPU_DUTY", "CELLSCALE_SIMULATED_GPU_PERIOD_S"})
"""cellscale's own variables a job may set: the GPU simulation of nodes without GPUs
(cellscale.runtime.usage; ignored where NVML sees real GPUs)."""


def check_env(env: dict[str, str]) -> dict[str, str]:
    """`env` as a job may set it (JobSpec.env): valid names of cellscale's bounds, none of
    cellscale's own, one line each, within MAX_ENV_BYTES; else a ValueError saying which."""
    for key, value in env.items():
        if len(key) > MAX_NAME_CHARS:
            raise ValueError(f"environment variable name {key[:20]!r}... is longer than {MAX_NAME_CHARS} characters")
        if not _ENV_KEY.match(key):
            raise ValueError(f"environment variable name {key!r} is invalid (letters, digits, _)")
        if key.startswith(_RESERVED_ENV_PREFIXES) and key not in USER_SETTABLE_ENV:
            raise ValueError(f"environment variable {key!r} is set by cellscale itself; pick another name")
        if "\0" in value or "\n" in value:
            raise ValueError(f"environment variable {key!r} contains a newline or NUL")
    size = env_bytes(env)
    if size > MAX_ENV_BYTES:
        raise ValueError(
            f"{size / 1024:.1f} KiB of environment ({size} bytes, each KEY=VALUE with its NUL); a job's "
            f"environment may be at most {MAX_ENV_BYTES // 1024} KiB: ship large values as a file or with --inputs"
        )
    return env


def env_bytes(env: Mapping[str, str]) -> int:
    """What `env` weighs in an exec: every `KEY=VALUE` in UTF-8 with its terminating NUL."""
    return sum(
        len(key.encode(errors="surrogatepass")) + len(value.encode(errors="surrogatepass")) + 2
        for key, value in env.items()
    )


def exec_limit() -> int:
    """ARG_MAX of this OS: the most bytes of arguments and environment one exec may carry."""
    try:
        limit = os.sysconf("SC_ARG_MAX")
    except (AttributeError, ValueError, OSError):
        limit = -1
    return limit if limit > 0 else 2 * 2**20


def exec_refusal(
    env: Mapping[str, str], argv: Sequence[str] = (), arg_max: int | None = None, reserve: int = EXEC_RESERVE_BYTES
) -> str | None:
    """Why the OS would refuse (E2BIG) to start a job's processes with this --env and these
    arguments, in one sentence that names --env; None if they fit. Each string must stay within
    MAX_ARG_STRLEN, and all of them (a pointer each, plus `reserve` for what the attempt adds)
    within ARG_MAX."""
    for key, value in env.items():
        size = len(key.encode(errors="surrogatepass")) + len(value.encode(errors="surrogatepass")) + 2
        if size > MAX_ARG_STRLEN:
            return (
                f"--env {key}: {size} bytes, more than the {MAX_ARG_STRLEN} bytes the OS allows one variable "
                "(Argument list too long); ship large values as a file or with --inputs"
            )
    for arg in argv:
        if len(arg.encode(errors="surrogatepass")) + 1 > MAX_ARG_STRLEN:
            return f"an argument is longer than the {MAX_ARG_STRLEN} bytes the OS allows one (Argument list too long)"
    limit = exec_limit() if arg_max is None else arg_max
    pointer = 8
    total = env_bytes(env) + pointer * len(env) + sum(len(a.encode(errors="surrogatepass")) + 1 + pointer for a in argv)
    if total + reserve > limit:
        return (
            f"--env and the job's arguments take {total} bytes; with the {reserve // 1024} KiB an attempt adds that "
            f"is more than the {limit} bytes this OS lets one process start with (ARG_MAX, Argument list too long): "
            "set fewer or smaller --env variables"
        )
    return None
