"""A real Prometheus for tests (Debian's `prometheus` package, 2.42; scripts/install installs it).

- `require(name)`: a Prometheus binary's path (`prometheus`, `promtool`); absent, the test is
  skipped, except in CI (the CI environment variable set), where it fails.
- `promtool(*args)`: runs promtool, failing the test with its output when it fails.
- `Prometheus(workdir, targets)`: a `prometheus` process on a free loopback port with its TSDB in
  `workdir`, config/prometheus/rules.yml loaded, scraping every 1 s and evaluating rules every
  1 s. `start()`, `wait_ready()`, `add_target(url, token) -> job label` (rewrites the config and
  POSTs /-/reload), `query(expr)`, `wait_for(expr, timeout)`, `rule_groups()`, `stop()`; also a context manager.
  A new target's first sample is queryable only after about 6 s: Prometheus's scrape manager
  applies target changes on a 5 s tick.

The session fixture `prometheus` (tests/integration/conftest.py) yields one started instance.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS_CONFIG = ROOT / "config" / "prometheus"
RULES = PROMETHEUS_CONFIG / "rules.yml"


def require(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not installed but CI is set (scripts/install installs Debian's prometheus)")
    pytest.skip(f"{name} is not installed (scripts/install installs Debian's prometheus package)")


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [require("promtool"), *map(str, args)]
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


class PrometheusError(RuntimeError):
    """A query Prometheus refused (bad PromQL, a timeout), with its errorType and error."""


@dataclass(frozen=True)
class Target:
    url: str  # the full metrics URL, e.g. http://127.0.0.1:8000/services/cellscale/metrics
    token: str | None = None  # sent as "Authorization: Bearer <token>"


def job_name(index: int) -> str:
    """The job label of the index-th target (in the order given and added)."""
    return f"target-{index}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    def __init__(self, workdir: Path, targets: tuple[Target, ...] = (), rules: Path = RULES) -> None:
        self.workdir = workdir
        self.targets = list(targets)
        self.rules = rules
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / "prometheus.yml"
        self.log = workdir / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the process -------------------------------------------------------------------------

    def start(self, timeout: float = 30) -> None:
        self._write_config()
        cmd = [
            require("prometheus"),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.process.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready within {timeout}s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    # -- targets -----------------------------------------------------------------------------

    def add_target(self, url: str, token: str | None = None) -> str:
        """Scrape one more target: rewrite the config and reload it (the first sample comes ~6 s
        later). Returns the target's job label."""
        self.targets.append(Target(url, token))
        self._write_config()
        response = httpx.post(f"{self.url}/-/reload", timeout=10)
        if response.status_code != 200:
            raise PrometheusError(f"reload failed ({response.status_code}): {response.text}")
        return job_name(len(self.targets) - 1)

    def _write_config(self) -> None:
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(self.rules)],
            "scrape_configs": [self._scrape_config(job_name(i), t) for i, t in enumerate(self.targets)],
        }
        self.config.write_text(yaml.safe_dump(config))

    def _scrape_config(self, job: str, target: Target) -> dict[str, Any]:
        parts = urlsplit(target.url)
        config: dict[str, Any] = {
            "job_name": job,
            "scheme": parts.scheme,
            "metrics_path": parts.path or "/metrics",
            "static_configs": [{"targets": [parts.netloc]}],
        }
        if target.token is not None:
            token_file = self.workdir / f"{job}.token"
            token_file.write_text(target.token)
            token_file.chmod(0o600)
            config["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
        return config

    # -- queries -----------------------------------------------------------------------------

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: the result's samples ({"metric": {...}, "value": [ts, "v"]}), a scalar
        as one sample without labels. Raises PrometheusError when Prometheus refuses the query."""
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{expr!r}: {body.get('errorType')}: {body.get('error')}")
        data = body["data"]
        if data["resultType"] in ("vector", "matrix"):
            return data["result"]
        return [{"metric": {}, "value": data["result"]}]

    def wait_for(self, expr: str, timeout: float = 20) -> list[dict[str, Any]]:
        """Poll `expr` until its result is not empty; on timeout, the error says each target's health."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.25)
        raise TimeoutError(f"{expr!r} still empty after {timeout}s; targets: {self.target_health()}")

    def target_health(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/targets", timeout=10)
        active = response.json()["data"]["activeTargets"]
        return [{key: t.get(key) for key in ("scrapeUrl", "health", "lastError")} for t in active]

    def rule_groups(self) -> list[dict[str, Any]]:
        """The loaded rule groups, with each rule's health and last error (/api/v1/rules)."""
        return httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
