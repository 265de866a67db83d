"""Telemetry: what the fleet cost and who it was for (pure ledger arithmetic; the store feeds it)."""
