"""A benchmark script (benchmarks/NAME.py) loaded as a module, for the unit tests of its
pure parts (the trace slicing, the simulators, the metrics)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # for its `from _common import ...` and `from trace_replay import ...`
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))
