"""The Grafana dashboards in config/dashboards/ and their queries, ready to run.

`dashboard_queries()` lists (file name, panel title, expr) for every panel target, with
Grafana's variables substituted so that Prometheus can run the expr as is: `$tenant` (exprs
filter with `tenant=~"$tenant"`) becomes `.*` (the variable's "All" value), `$__rate_interval`
`1m` and `$__range` `1h`. An expr that uses any other variable raises ValueError.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "config" / "dashboards"
SUBSTITUTIONS = {"$__rate_interval": "1m", "$__range": "1h", "$tenant": ".*"}


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def substitute(expr: str) -> str:
    for variable, value in SUBSTITUTIONS.items():  # $__rate_interval and $__range before any shorter name
        expr = expr.replace(variable, value)
    if left := re.findall(r"\$\{?\w+", expr):
        raise ValueError(f"{expr!r}: no substitution for {left}")
    return expr


def dashboard_queries() -> list[tuple[str, str, str]]:
    return [
        (path.name, panel["title"], substitute(target["expr"]))
        for path in dashboard_files()
        for panel in load(path)["panels"]
        for target in panel["targets"]
    ]
