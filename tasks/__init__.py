"""Prefect tasks: thin wrappers over `specregen.pipeline`, one module per stage.

Tasks take the config path and dataset name (small, hashable, recorded in the UI) and never a
secret; their cache keys are (dataset, stage, chunk, fingerprint), so a new run or a UI Retry
skips finished chunks. The stage manifests in storage stay the source of truth.
"""
