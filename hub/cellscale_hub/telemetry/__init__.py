"""Telemetry and cost: the ledger (metering, attribution), estimates, and /metrics."""
