"""`specregen infer` and `specregen reconstruct` against the real vLLM with Qwen3: single turns
and whole conversations, streamed and not, the server's own ids as the truth (see
test_k25_flows.py)."""

from __future__ import annotations

import pytest

from tests.integration.test_conversation_samples import (
    assert_masks_are_the_generated_ids,
    conversations,
)
from tests.realvllm.flows import infer_and_reconstruct, single_turns

STREAMS = ["--stream", "--no-stream"]


@pytest.mark.parametrize("stream", STREAMS)
def test_single_turns_are_the_servers_ids(qwen3, tmp_path, stream):
    samples, truth = infer_and_reconstruct(qwen3, tmp_path, single_turns(6), stream,
                                           blind=False, seed=1)
    assert len(samples) == 6
    for s in samples:
        record = truth[s.sample_id]
        assert s.input_ids[: s.prompt_len] == record["prompt_token_ids"]
        assert s.input_ids[s.prompt_len:] == record["reference_completion_ids"]
        assert s.evidence == "reference" and s.status == "ok", (s.sample_id, s.flags)


@pytest.mark.parametrize("stream", STREAMS)
def test_whole_conversations_mask_what_the_server_says_the_model_wrote(qwen3, tmp_path,
                                                                       stream):
    samples, truth = infer_and_reconstruct(qwen3, tmp_path, conversations(4), stream,
                                           "--turns", "all", seed=5, divergence_rate=0.3)
    assert_masks_are_the_generated_ids(samples, truth, qwen3.spec.stop_id)
    assert any(sum(s.loss_mask) > s.completion_len for s in samples)


def test_logprobs_prove_the_ids_without_the_servers_ids(qwen3, tmp_path):
    samples, truth = infer_and_reconstruct(qwen3, tmp_path, single_turns(6), "--no-stream",
                                           "--logprobs", blind=True, seed=2,
                                           keep_logprobs=True)
    for s in samples:
        assert s.input_ids[s.prompt_len:] == truth[s.sample_id]["reference_completion_ids"]
        assert s.evidence == "logprobs", (s.sample_id, s.flags)
