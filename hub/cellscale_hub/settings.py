"""The control plane's settings: ControlPlane's traits, read once at start into one frozen
object that the controller's reconcilers run by and the API reports (its context holds the
same object). A test or benchmark that retunes a running controller gives it a new one
(`dataclasses.replace`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """The control plane's policy settings (ControlPlane's traits): what the controller's
    reconcilers run by, and what the API reports."""

    interval: float = 0.5  # seconds between reconcile cycles
    # a wake (a submit, a cancel) within wake_gap_s of the last cycle's start waits for the rest of
    # it: a flood of submits runs a cycle per gap, not one per submit
    wake_gap_s: float = 0.05
    launches_per_cycle: int = 16  # a burst of submits must not starve polls and cancels
    preemption_grace_s: float = 30.0  # from a victim's warning to its stop: its time to checkpoint
    fair_share_half_life_s: float = 3600.0
    heartbeat_timeout_s: float = 60.0  # silence of a running attempt before it counts as hung
    bundle_sweep_s: float = 600.0
    bundle_keep_succeeded_s: float = 86400.0
    # admission runs when something it decides on changed, else every admission_interval_s
    # (fair share decays, estimates age)
    admission_interval_s: float = 30.0
    # the change feed of waiting jobs is diffed against every waiting id this often, as a safety
    # net (a change that wrote no event); between, admission reads only new events
    pending_resync_s: float = 600.0
    backfill_depth: int | None = 100  # jobs a cycle looks at behind a queue's first waiting one (bf_max_job_test)
    # sites: an attempt that never started on a backend whose scheduler stopped answering moves
    # elsewhere after site_lost_timeout_s; a cloud pool that had no capacity or reclaimed a node
    # gets no new work for cloud_backoff_s
    site_lost_timeout_s: float = 120.0
    cloud_backoff_s: float = 600.0
    cloud_bill_interval_s: float = 30.0
    # the cost ledger: running attempts get a row every meter_interval_s, ended ones at once
    meter_interval_s: float = 60.0
