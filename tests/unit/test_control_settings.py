"""One frozen Settings (settings.py): the control plane reads its traits into it once,
the controller hands it to every reconciler, and a retuned controller hands each the new one."""

from __future__ import annotations

import dataclasses
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
