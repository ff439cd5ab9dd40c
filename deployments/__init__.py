"""Prefect deployments for specregen (orchestration only; the work is in the library)."""
