"""Prefect tasks for specregen (orchestration only; the work lives in the specregen library)."""
