"""What one node of an attempt used: GPU-seconds busy, CPU seconds and peak memory of its
process tree, sampled by the node's supervisor (`UsageMeter`) and written to node<k>/usage.json.

GPU busy time comes from NVML (`NvmlSampler`) on a node with NVIDIA GPUs, or from
`SimulatedGpus` where a job asks for the simulation (CELLSCALE_SIMULATED_GPU_DUTY): machines
without GPUs (tests, the dev clusters). Without either, GPU use is unknown (None), never 0.
Light imports only: psutil, and pynvml when a node has it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import psutil

from cellscale.runtime.records import NodeUsage

DUTY_VAR = "CELLSCALE_SIMULATED_GPU_DUTY"
PERIOD_VAR = "CELLSCALE_SIMULATED_GPU_PERIOD_S"
SAMPLE_VAR = "CELLSCALE_USAGE_SAMPLE_S"
DEFAULT_SAMPLE_S = 2.0


class GpuSampler(Protocol):
    source: str  # "nvml" | "simulated": NodeUsage.source

    def busy(self) -> list[float]:
        """Per GPU of the node, the fraction of time (0..1) it was busy since the previous call."""
        ...


class NvmlSampler:
    """The node's visible GPUs through NVML. NVML's utilization is the share of its own last
    sample period (1/6 s to 1 s, by product) in which a kernel ran, not an average since the
    previous call: a reading every few seconds estimates the interval's busy share."""

    source = "nvml"

    def __init__(self, nvml: Any, handles: list[Any]):
        self._nvml = nvml
        self._handles = handles

    @classmethod
    def open(cls, visible: str | None) -> NvmlSampler | None:
        """The GPUs that CUDA_VISIBLE_DEVICES (`visible`: indices or GPU-/MIG- UUIDs; None: all)
        names; None without pynvml, a driver or any such GPU."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            handles = [_handle(pynvml, device) for device in _devices(visible, pynvml.nvmlDeviceGetCount)]
        except (pynvml.NVMLError, ValueError):
            return None
        return cls(pynvml, handles) if handles else None

    def busy(self) -> list[float]:
        return [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100 for h in self._handles]


def _devices(visible: str | None, count: Callable[[], int]) -> list[str]:
    if visible is None:
        return [str(index) for index in range(count())]
    return [device.strip() for device in visible.split(",") if device.strip()]


def _handle(nvml: Any, device: str) -> Any:
    if device.startswith(("GPU-", "MIG-")):
        return nvml.nvmlDeviceGetHandleByUUID(device)
    return nvml.nvmlDeviceGetHandleByIndex(int(device))


class SimulatedGpus:
    """A SIMULATION of NVML for machines without GPUs (tests, the dev clusters), never a
    measurement: each of `gpus` GPUs is busy for the first `duty` × `period_s` seconds of
    every `period_s` seconds of wall time (counted from the Unix epoch), and `busy()` is the
    exact share of that square wave in the interval since the previous call."""

    source = "simulated"

    def __init__(self, gpus: int, duty: float, period_s: float = 1.0, clock: Callable[[], float] = time.time):
        self.gpus, self.duty, self.period_s = gpus, duty, period_s
        self._clock = clock
        self._last = clock()

    def busy(self) -> list[float]:
        now, last = self._clock(), self._last
        self._last = now
        share = (self._busy_until(now) - self._busy_until(last)) / (now - last) if now > last else self.duty
        return [share] * self.gpus

    def _busy_until(self, t: float) -> float:
        """Busy seconds of the wave from the epoch to `t`."""
        periods, into = divmod(t, self.period_s)
        return periods * self.duty * self.period_s + min(into, self.duty * self.period_s)


def gpu_sampler(env: Mapping[str, str], gpus: int) -> GpuSampler | None:
    """How to sample the GPUs of a node whose ranks run in `env`: NVML where there are GPUs to
    sample; on a node without them (emulated GPUs: dev clusters, tests), the simulation when the
    job asks for it (a job on real GPUs cannot pretend); else None (GPU use unknown)."""
    real = NvmlSampler.open(env.get("CUDA_VISIBLE_DEVICES")) if gpus > 0 else None
    if real is not None or DUTY_VAR not in env:
        return real
    duty = _number(env, DUTY_VAR, "a number from 0 to 1", lambda x: 0 <= x <= 1)
    period = _number(env, PERIOD_VAR, "a number of seconds above 0", lambda x: x > 0, default=1.0)
    return SimulatedGpus(gpus, duty, period)


def sample_interval(env: Mapping[str, str]) -> float:
    """Seconds between two samples (CELLSCALE_USAGE_SAMPLE_S)."""
    return _number(env, SAMPLE_VAR, "a number of seconds above 0", lambda x: x > 0, default=DEFAULT_SAMPLE_S)


def _number(
    env: Mapping[str, str], name: str, what: str, valid: Callable[[float], bool], default: float | None = None
) -> float:
    raw = env.get(name)
    if raw is None and default is not None:
        return default
    try:
        value = float(raw or "")
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and valid(value)):
        raise ValueError(f"{name} must be {what}, not {raw!r}")
    return value


CREATE_TIME_SLACK_S = 1.0  # process start times are kernel ticks: a job's first child may read as a little older


class UsageMeter:
    """A node's use since `since`, cumulative: GPU busy seconds from `sampler`, and the CPU
    seconds and peak summed RSS of the processes below `root` (its children, recursively)
    started since the meter was (the job's: a supervisor starts its meter before the job).

    A process's CPU time counts as last seen, so one that exits keeps what it used until the
    sample before; what it used after that sample, or a process that lived between two
    samples, is missed. Not thread-safe: one caller at a time."""

    def __init__(self, gpus: int, sampler: GpuSampler | None, root: int | None = None, since: float | None = None):
        self.gpus = gpus
        self.sampler = sampler
        self.root = psutil.Process(root if root is not None else os.getpid())
        self.since = self.at = time.time() if since is None else since
        self.gpu_used_s: float | None = 0.0 if sampler or gpus == 0 else None
        self.gpu_sampled_s = 0.0
        self.memory_peak_bytes = 0
        self._cpu: dict[tuple[int, float], float] = {}  # (pid, start time): CPU seconds last seen
        self._born_after = time.time() - CREATE_TIME_SLACK_S

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu.values())

    def sample(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        seconds = max(0.0, now - self.at)
        if self.sampler is not None:
            busy = self.sampler.busy()
            self.gpu_used_s = (self.gpu_used_s or 0.0) + sum(busy) * seconds
            self.gpu_sampled_s += len(busy) * seconds
        self._sample_processes()
        self.at = now

    def _sample_processes(self) -> None:
        rss = 0
        for process in self.root.children(recursive=True):
            try:
                with process.oneshot():
                    created = process.create_time()
                    if created < self._born_after:  # older than the meter: not this job's
                        continue
                    times = process.cpu_times()
                    self._cpu[(process.pid, created)] = times.user + times.system
                    rss += process.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # ended since listed (a zombie keeps its times)
                continue
        self.memory_peak_bytes = max(self.memory_peak_bytes, rss)

    def record(self) -> NodeUsage:
        """The use so far, as of the last sample."""
        return NodeUsage(
            since=self.since,
            at=self.at,
            gpus=self.gpus,
            source=self.sampler.source if self.sampler else "none",
            gpu_used_s=self.gpu_used_s,
            gpu_sampled_s=self.gpu_sampled_s,
            cpu_s=self.cpu_s,
            memory_peak_bytes=self.memory_peak_bytes,
        )
