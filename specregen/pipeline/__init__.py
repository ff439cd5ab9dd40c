"""The dataset pipeline as library stages; Prefect flows only chain them (flows/, tasks/).

One dataset goes through:

    prompts   source rows -> Prompt chunks (+ rejected rows with reasons)
    infer     each chunk -> its raw log (paid; resumable; a rerun sends only what is missing)
    reconstruct each chunk's raw log -> a TokenSample shard (free; re-run when the tokenizer or
              the reconstruction code changes)
    gate      all shards -> accepted / quarantined shards + report; pass or fail
    publish   accepted shards -> published shards with sha256 manifest (only after a pass)

Every stage writes under `{storage}/{dataset}/` and ends by writing a manifest whose fingerprint
covers what its output depends on; a stage is done exactly when that manifest exists.
"""
