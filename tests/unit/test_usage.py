"""The in-job usage meter: simulated and NVML GPU samplers, CPU and memory of a process tree,
and usage.json as a supervisor writes it."""

import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from cellscale.runtime.usage import (
    DUTY_VAR,
    PERIOD_VAR,
    SAMPLE_VAR,
    NvmlSampler,
    SimulatedGpus,
    UsageMeter,
    gpu_sampler,
    sample_interval,
)
from tests.unit.test_runtime import job_dir, supervise

EPOCH = 1_700_000_000.0  # a whole number of periods, as wall time is


class Clock:
    def __init__(self, t: float = EPOCH):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_simulated_gpus_are_busy_for_exactly_their_duty_over_whole_periods():
    clock = Clock()
    gpus = SimulatedGpus(3, duty=0.4, clock=clock)
    for _ in range(3):
        clock.t += 2.0
        assert gpus.busy() == pytest.approx([0.4] * 3, abs=1e-6)
    busy_s = 0.0
    for _ in range(100):  # 37 s at odd intervals: the whole periods hold 0.4 × 37 busy seconds
        clock.t += 0.37
        busy_s += gpus.busy()[0] * 0.37
    assert busy_s == pytest.approx(0.4 * 37, abs=1e-5)


def test_simulated_gpus_integrate_a_partial_period_exactly():
    clock = Clock()
    gpus = SimulatedGpus(1, duty=0.4, period_s=0.5, clock=clock)  # busy 0.2 s of every 0.5 s
    for step, share in [(0.1, 1.0), (0.2, 0.5), (0.2, 0.0), (0.5, 0.4), (0.35, 0.2 / 0.35)]:
        clock.t += step
        assert gpus.busy()[0] == pytest.approx(share, abs=1e-5)


def test_the_simulation_is_chosen_by_the_jobs_environment_and_validated():
    sampler = gpu_sampler({DUTY_VAR: "0.4", PERIOD_VAR: "0.5"}, gpus=2)
    assert isinstance(sampler, SimulatedGpus) and sampler.source == "simulated"
    assert (sampler.gpus, sampler.duty, sampler.period_s) == (2, 0.4, 0.5)
    assert gpu_sampler({DUTY_VAR: "1"}, gpus=1).period_s == 1.0
    for env, name in [
        ({DUTY_VAR: "busy"}, DUTY_VAR),
        ({DUTY_VAR: "1.5"}, DUTY_VAR),
        ({DUTY_VAR: "-0.1"}, DUTY_VAR),
        ({DUTY_VAR: "nan"}, DUTY_VAR),
        ({DUTY_VAR: ""}, DUTY_VAR),
        ({DUTY_VAR: "0.5", PERIOD_VAR: "0"}, PERIOD_VAR),
    ]:
        with pytest.raises(ValueError, match=name):
            gpu_sampler(env, gpus=1)
    assert gpu_sampler({}, gpus=0) is None
    assert sample_interval({}) == 2.0 and sample_interval({SAMPLE_VAR: "0.5"}) == 0.5
    with pytest.raises(ValueError, match=SAMPLE_VAR):
        sample_interval({SAMPLE_VAR: "0"})


def test_without_nvml_gpu_use_is_unknown(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails, as where nvidia-ml-py is not installed
    assert gpu_sampler({"CUDA_VISIBLE_DEVICES": "0"}, gpus=1) is None
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_fails=True))  # installed, no driver
    assert gpu_sampler({"CUDA_VISIBLE_DEVICES": "0"}, gpus=1) is None
    meter = UsageMeter(gpus=1, sampler=None)
    meter.sample()
    assert meter.record().gpu_used_s is None and meter.record().source == "none"
    assert UsageMeter(gpus=0, sampler=None).record().gpu_used_s == 0.0  # no GPUs: none used, known


def fake_nvml(init_fails: bool = False, count: int = 3) -> SimpleNamespace:
    class NVMLError(Exception):
        pass

    def init():
        if init_fails:
            raise NVMLError("Driver Not Loaded")

    return SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=init,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: f"index {i}",
        nvmlDeviceGetHandleByUUID=lambda uuid: f"uuid {uuid}",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu={"index 1": 50, "uuid GPU-ab": 25}.get(h, 100)),
    )


def test_nvml_samples_the_gpus_cuda_visible_devices_names(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    sampler = gpu_sampler({"CUDA_VISIBLE_DEVICES": "1, GPU-ab"}, gpus=2)
    assert isinstance(sampler, NvmlSampler) and sampler.source == "nvml"
    assert sampler.busy() == [0.5, 0.25]
    assert NvmlSampler.open(None).busy() == [1.0, 0.5, 1.0]  # unset: every GPU
    assert NvmlSampler.open("") is None  # none visible
    assert NvmlSampler.open("first") is None


def test_gpu_seconds_are_busy_share_times_seconds_per_gpu():
    clock = Clock()
    meter = UsageMeter(gpus=2, sampler=SimulatedGpus(2, duty=0.25, clock=clock), since=EPOCH)
    for _ in range(5):
        clock.t += 2.0
        meter.sample(clock.t)
    usage = meter.record()
    assert (usage.since, usage.at, usage.gpus, usage.source) == (EPOCH, EPOCH + 10, 2, "simulated")
    assert usage.gpu_sampled_s == pytest.approx(20.0) and usage.gpu_used_s == pytest.approx(5.0, abs=1e-4)


BURN = """\
import sys, time
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
print("burnt", flush=True)
{then}
"""


def burner(then: str) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", BURN.format(then=then)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline() == "burnt\n"
    return child


def test_cpu_of_a_child_that_exits_still_counts():
    meter = UsageMeter(gpus=0, sampler=None)
    child = burner(then="sys.stdin.read()")  # burns, then waits for its input to close
    meter.sample()
    seen = meter.cpu_s
    assert 0.25 < seen < 5 and meter.memory_peak_bytes > 1_000_000
    child.stdin.close()
    child.wait(timeout=30)
    meter.sample()
    assert meter.cpu_s == seen


def test_cpu_of_a_child_that_ended_before_any_sample_counts_until_it_is_reaped():
    meter = UsageMeter(gpus=0, sampler=None)
    child = burner(then="")
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.02)
    meter.sample()  # a zombie keeps its CPU times until its parent waits for it
    child.wait(timeout=30)
    assert meter.cpu_s > 0.25


def test_the_supervisor_writes_what_the_node_used(tmp_path, monkeypatch):
    monkeypatch.setenv(SAMPLE_VAR, "0.2")
    source = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end:\n    pass\ntime.sleep(1)"
    env = {DUTY_VAR: "0.4", PERIOD_VAR: "0.1"}  # as `--env` sets them
    jd = job_dir(tmp_path, source, env=env, gpus_per_node=2)
    supervise(jd)
    assert jd.read_exit(1).reason == "succeeded"
    usage = jd.read_usage(1)
    assert usage.source == "simulated" and usage.gpus == 2
    assert usage.at - usage.since > 1.0 and usage.gpu_sampled_s == pytest.approx(2 * (usage.at - usage.since))
    assert usage.gpu_used_s / usage.gpu_sampled_s == pytest.approx(0.4, abs=0.05)
    assert usage.cpu_s > 0.25 and usage.memory_peak_bytes > 1_000_000


def test_a_bad_simulation_setting_never_breaks_the_job(tmp_path):
    jd = job_dir(tmp_path, "print('ran')", env={DUTY_VAR: "lots"})
    run = supervise(jd)
    assert jd.read_exit(1).reason == "succeeded" and "[rank 0] ran" in jd.log.read_text()
    assert jd.read_usage(1) is None and DUTY_VAR in run.stderr
