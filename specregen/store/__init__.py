"""Storage: parquet shards of token samples, append-only logs, manifests (fsspec paths)."""
