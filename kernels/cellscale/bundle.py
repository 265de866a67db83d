"""Pack the notebook variables a job needs, checking size and picklability before submit."""

from __future__ import annotations

import hashlib

import cloudpickle

from cellscale.spec import MAX_INPUTS_BYTES


class InputError(ValueError):
    pass


def pack_inputs(namespace: dict, names: list[str], limit: int = MAX_INPUTS_BYTES) -> bytes:
    """Pickle the named variables; the message of any failure names the variable and the fix."""
    missing = [name for name in names if name not in namespace]
    if missing:
        raise InputError(
            f"--inputs names {', '.join(missing)}, not defined in this notebook; run the cell that defines it first"
        )
    sizes, parts = {}, {}
    for name in names:
        try:
            parts[name] = cloudpickle.dumps(namespace[name])
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
            raise InputError(
                f"--inputs {name}: a {type(namespace[name]).__name__} cannot be pickled ({exc}); "
                "rebuild it inside the cell, or pass what it is made from"
            ) from None
        sizes[name] = len(parts[name])
    blob = cloudpickle.dumps({name: _Loaded(part) for name, part in parts.items()})
    if len(blob) > limit:
        biggest = max(sizes, key=sizes.get)
        raise InputError(
            f"--inputs are {_mib(len(blob))} pickled (largest: {biggest}, {_mib(sizes[biggest])}); the limit is "
            f"{_mib(limit)}: write big data to shared storage and read it in the cell"
        )
    return blob


def bundle_sha256(blob: bytes) -> str:
    """A bundle's content address: what POST /api/bundles files it under and answers with, known
    before it is sent (a spec names its bundles by it, validated before anything is uploaded)."""
    return hashlib.sha256(blob).hexdigest()


class _Loaded:
    """Carries a variable's own pickle, so one bad variable is reported by name."""

    def __init__(self, data: bytes):
        self.data = data

    def __reduce__(self):
        return (cloudpickle.loads, (self.data,))


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
