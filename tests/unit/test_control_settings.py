"""One frozen Settings (settings.py): the control plane reads its traits into it once,
the controller hands it to every reconciler, and a retuned controller hands each the new one."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest

from cellscale_hub.app import ControlPlane
from cellscale_hub.control.controller import Controller
from cellscale_hub.settings import Settings


def test_the_control_planes_traits_become_its_settings():
    app = ControlPlane(poll_interval=2.0, preemption_grace=5.0, meter_interval=7.0, bundle_keep_succeeded=0.0)
    settings = app.settings()
    assert (settings.interval, settings.preemption_grace_s, settings.meter_interval_s) == (2.0, 5.0, 7.0)
    assert settings.bundle_keep_succeeded_s == 0.0
    assert settings.launches_per_cycle == Settings().launches_per_cycle  # not a trait: the default
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.interval = 1.0


def test_every_reconciler_runs_by_the_controllers_settings_and_a_retune_reaches_them_all():
    controller = Controller(None, {}, None, None, SimpleNamespace(revision=1), Settings(preemption_grace_s=5.0))
    reconcilers = (controller.admission, controller.attempts, controller.site_watch, controller.metering)
    assert all(r.settings is controller.settings for r in reconcilers)
    controller.settings = dataclasses.replace(controller.settings, meter_interval_s=1.0)
    assert all(r.settings.meter_interval_s == 1.0 and r.settings.preemption_grace_s == 5.0 for r in reconcilers)


def test_a_flood_of_wakes_within_the_gap_runs_one_cycle_after_it():
    settings = Settings(interval=3600.0, wake_gap_s=0.2)  # no tick: only wakes run cycles
    controller = Controller(None, {}, None, None, SimpleNamespace(revision=1), settings)
    started: list[float] = []
    controller.cycle = lambda: started.append(time.monotonic())
    controller.start()
    try:
        wait_until(lambda: len(started) == 1)
        for _ in range(100):  # a flood of submits, each waking the controller
            controller.wake()
        wait_until(lambda: len(started) == 2)
    finally:
        controller.stop()
    assert len(started) == 2  # one cycle for the whole flood
    assert started[1] - started[0] >= 0.2 - 0.01  # not before the gap from the first cycle's start


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)
