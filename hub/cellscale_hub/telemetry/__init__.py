"""Telemetry and cost: the ledger (metering, attribution), the estimate, and /metrics."""
