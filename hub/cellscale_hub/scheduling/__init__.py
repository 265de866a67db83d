"""Pure scheduling functions over snapshots: no store, no I/O (checked by import-linter)."""
