"""A sweep's grid as JSON: the points manifest the kernel uploads, the control plane reads
and hashes (never unpickling anything), and each task decodes into the point's variables.

A grid is a list of dicts, a pandas DataFrame (one point per row), or a dict of lists meaning
their product. A value is a number, a string, a boolean, None, a date or datetime (also
numpy's and pandas' scalars, converted), or a list or dict of those; anything else is refused
by name, with the fix. Dates travel tagged: {"$date": "2024-01-02"}, {"$datetime": "...T..."}.

    {"points": [{"lr": 0.1, "day": {"$date": "2024-01-02"}}, ...]}
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import keyword
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_POINT_BYTES = 64 * 1024
"""Largest one point may be as JSON: bigger values belong in --inputs, indexed by a parameter."""


class GridError(ValueError):
    """The grid cannot be a sweep's points; the message names the point, the value and the fix."""


def points_of(grid: Any) -> list[dict[str, Any]]:
    """The grid's points, in order: rows of a DataFrame, the items of a list of dicts, or the
    product of a dict of lists (the first key varies slowest, as itertools.product does)."""
    if hasattr(grid, "to_dict") and hasattr(grid, "columns"):  # a pandas DataFrame
        return [dict(row) for row in grid.to_dict(orient="records")]
    if isinstance(grid, Mapping):
        names = list(grid)
        axes = []
        for name in names:
            values = grid[name]
            if isinstance(values, str | bytes) or not isinstance(values, Iterable):
                raise GridError(f"grid[{name!r}] is not a list of values: a dict of lists means their product")
            axes.append(list(values))
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes)]
    if isinstance(grid, Iterable) and not isinstance(grid, str | bytes):
        points = list(grid)
        for i, point in enumerate(points):
            if not isinstance(point, Mapping):
                raise GridError(f"point {i} is a {type(point).__name__}, not a dict of parameter values")
        return [dict(p) for p in points]
    raise GridError(
        f"a {type(grid).__name__} is not a grid: pass a list of dicts, a DataFrame, or a dict of lists (their product)"
    )


def encode_point(point: Mapping[str, Any], index: int = 0) -> dict[str, Any]:
    """The point as JSON-ready values, checked: names are variable names, values JSON-able."""
    if not point:
        raise GridError(f"point {index} has no parameters")
    out = {}
    for name, value in point.items():
        if not isinstance(name, str) or not _IDENT.match(name) or keyword.iskeyword(name):
            raise GridError(
                f"point {index}: parameter {name!r} is not a Python variable name (the cell sees it as one)"
            )
        out[name] = _encode(value, f"point {index}: {name}")
    if len(json.dumps(out)) > MAX_POINT_BYTES:
        raise GridError(
            f"point {index} is larger than {MAX_POINT_BYTES // 1024} KiB as JSON: put big values in --inputs "
            "and index them by a parameter"
        )
    return out


def _encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return {"$float": repr(value)}
        return float(value)
    if isinstance(value, dt.datetime):  # before date: a datetime is a date
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and type(value).__module__.startswith("numpy") and getattr(value, "shape", None) == ():
        return _encode(item(), where)
    to_pydatetime = getattr(value, "to_pydatetime", None)  # pandas.Timestamp
    if callable(to_pydatetime) and type(value).__module__.startswith("pandas"):
        return _encode(to_pydatetime(), where)
    if isinstance(value, list | tuple):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        if any(k.startswith("$") for k in value):
            raise GridError(f"{where}: keys starting with '$' are reserved")
        return {k: _encode(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise GridError(
        f"{where} is a {type(value).__name__}: sweep parameters are numbers, strings, booleans, dates, or lists "
        "and dicts of them; put other objects in --inputs and index them by a parameter"
    )


def decode(value: Any) -> Any:
    """A manifest value back to Python (in the task, and in the notebook's DataFrame)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, text),) = value.items()
            if tag == "$date":
                return dt.date.fromisoformat(text)
            if tag == "$datetime":
                return dt.datetime.fromisoformat(text)
            if tag == "$float":
                return float(text)
        return {k: decode(v) for k, v in value.items()}
    return value


def manifest(points: list[Mapping[str, Any]]) -> bytes:
    """The points manifest to upload: canonical JSON (sorted keys, no spaces), so an unchanged
    grid uploads the same bytes and hashes alike."""
    encoded = [encode_point(p, i) for i, p in enumerate(points)]
    return canonical({"points": encoded})


def read_manifest(data: bytes) -> list[dict[str, Any]]:
    """The encoded points of a manifest, checked as `manifest` made them (the control plane
    reads a user's upload with it: JSON only)."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GridError(f"the points manifest is not JSON ({exc})") from None
    points = body.get("points") if isinstance(body, dict) else None
    if not isinstance(points, list) or not points:
        raise GridError('the points manifest must be {"points": [ {...}, ... ]} with at least one point')
    for i, point in enumerate(points):
        if not isinstance(point, dict):
            raise GridError(f"point {i} of the manifest is not an object")
        encode_point(decode(point), i)  # same rules as the kernel's
    return points


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def point_key(code_key: str, point: Mapping[str, Any]) -> str:
    """The result cache's key of one point: the code that runs it (`code_key`: the cell, its
    inputs, outputs and environment) and the point's encoded values."""
    return hashlib.sha256(code_key.encode() + b"\0" + canonical(point)).hexdigest()
