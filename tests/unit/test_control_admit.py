"""The admission reconciler's trigger (control/admit.py): it admits after a request (a submit,
an attempt's start or end), when the tenancy or a backend's capacity changed, or once
admission_interval_s has passed; otherwise an idle queue is not scored again."""

from __future__ import annotations

from types import SimpleNamespace

from cellscale_hub.control.admit import Admitter
from cellscale_hub.settings import Settings


def admitter(**settings) -> Admitter:
    book = SimpleNamespace(revision=1)
    return Admitter(None, {}, None, book, None, None, None, Settings(**settings), wake=lambda: None)


def settled(admission: Admitter, capacities: dict) -> Admitter:
    """As after an admission cycle over these capacities."""
    admission.needed(capacities)
    admission.due, admission._admitted_at = False, float("inf")
    return admission


def test_the_first_cycle_admits():
    assert admitter().needed({"gpu": 8})


def test_nothing_changed_nothing_to_admit():
    admission = settled(admitter(), {"gpu": 8})
    assert not admission.needed({"gpu": 8})


def test_a_request_a_capacity_or_a_tenancy_change_admits():
    admission = settled(admitter(), {"gpu": 8})
    admission.request()
    assert admission.needed({"gpu": 8})
    admission = settled(admitter(), {"gpu": 8})
    assert admission.needed({"gpu": 4})
    admission = settled(admitter(), {"gpu": 8})
    admission.tenancy.revision = 2
    assert admission.needed({"gpu": 8})


def test_the_timer_admits_when_it_comes_round():
    admission = settled(admitter(admission_interval_s=0.0), {"gpu": 8})
    admission._admitted_at = 0.0
    assert admission.needed({"gpu": 8})
