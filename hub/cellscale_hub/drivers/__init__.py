"""Drivers: one module per scheduler kind. Admins name a driver class by its entry-point
name in the `cellscale.drivers` group (e.g. "local") or by its import path."""

from __future__ import annotations

from importlib.metadata import entry_points

from traitlets.utils.importstring import import_item

from cellscale_hub.drivers.base import AttemptRef, Driver, Observation, SpecRejected


def driver_class(name: str) -> type[Driver]:
    for entry in entry_points(group="cellscale.drivers"):
        if entry.name == name:
            return entry.load()
    if "." in name:
        return import_item(name)
    known = sorted(e.name for e in entry_points(group="cellscale.drivers"))
    raise ValueError(f"unknown driver {name!r}; known drivers: {', '.join(known)} (or a dotted class path)")


__all__ = ["AttemptRef", "Driver", "Observation", "SpecRejected", "driver_class"]
