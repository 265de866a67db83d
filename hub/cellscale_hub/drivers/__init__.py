"""Drivers: one module per scheduler kind. Admins name a driver class by its entry-point
name in the `cellscale.drivers` group (e.g. "local") or by its import path."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib.metadata import entry_points

from traitlets.utils.importstring import import_item

from cellscale.spec import BackendView
from cellscale_hub.drivers.base import Driver
from cellscale_hub.drivers.types import AttemptRef, BackendUnreachable, Observation, SpecRejected
from cellscale_hub.scheduling.resources import UNLIMITED, Amounts
from cellscale_hub.tenancy import Tenancy

log = logging.getLogger("cellscale.drivers")


def driver_class(name: str) -> type[Driver]:
    for entry in entry_points(group="cellscale.drivers"):
        if entry.name == name:
            return entry.load()
    if "." in name:
        return import_item(name)
    known = sorted(e.name for e in entry_points(group="cellscale.drivers"))
    raise ValueError(f"unknown driver {name!r}; known drivers: {', '.join(known)} (or a dotted class path)")


def flavor_capacities(tenancy: Tenancy, drivers: Mapping[str, Driver]) -> dict[str, Amounts]:
    """Physical GPUs, cores and memory per flavor: its backend's capacity (a backend that does
    not answer, or is not configured, has none; one that does not count cores or memory does
    not bound them)."""
    out = {}
    for flavor, spec in tenancy.flavors.items():
        driver = drivers.get(spec.backend)
        try:
            out[flavor] = amounts_of(driver.capacity()) if driver else Amounts()
        except Exception:  # admission goes on for the other backends
            log.exception("backend %s did not report its capacity; nothing is admitted on it now", spec.backend)
            out[flavor] = Amounts()
    return out


def amounts_of(view: BackendView) -> Amounts:
    return Amounts(
        view.capacity_gpus,
        UNLIMITED if view.capacity_cpus is None else view.capacity_cpus,
        UNLIMITED if view.capacity_memory_mb is None else view.capacity_memory_mb,
    )


__all__ = [
    "AttemptRef",
    "BackendUnreachable",
    "Driver",
    "Observation",
    "SpecRejected",
    "driver_class",
    "flavor_capacities",
]
