"""`specregen infer` and `specregen reconstruct` against the real vLLM, per family: single turns
and whole conversations, streamed and not. The server's own ids (`return_token_ids`) are the
truth: blind (the ids stripped from the raw log) every sample's prompt is the server's and its
loss mask covers exactly the ids the server says the model generated; with them, every sample
is proven by them (evidence `reference`); with logprobs alone, by those (evidence
`logprobs`)."""

from __future__ import annotations

import pytest

from tests.integration.test_conversation_samples import (
    assert_masks_are_the_generated_ids,
    conversations,
)
from tests.realvllm.flows import FAMILIES, infer_and_reconstruct, single_turns

STREAMS = ["--stream", "--no-stream"]
pytestmark = pytest.mark.parametrize("family", FAMILIES, indirect=True)


@pytest.mark.parametrize("stream", STREAMS)
def test_single_turns_are_the_servers_ids(family, tmp_path, stream):
    samples, truth = infer_and_reconstruct(family, tmp_path, single_turns(6), stream,
                                           blind=False, seed=1)
    assert len(samples) == 6
    for s in samples:
        record = truth[s.sample_id]
        assert s.input_ids[: s.prompt_len] == record["prompt_token_ids"]
        assert s.input_ids[s.prompt_len:] == record["reference_completion_ids"]
        assert s.evidence == "reference" and s.status == "ok", (s.sample_id, s.flags)


@pytest.mark.parametrize("stream", STREAMS)
def test_whole_conversations_mask_what_the_server_says_the_model_wrote(family, tmp_path,
                                                                       stream):
    samples, truth = infer_and_reconstruct(family, tmp_path, conversations(4), stream,
                                           "--turns", "all", seed=5, divergence_rate=0.3)
    assert_masks_are_the_generated_ids(samples, truth, family.spec.stop_id)
    assert any(sum(s.loss_mask) > s.completion_len for s in samples)  # tool loops masked
    # Blind, a sample is trusted only where nothing can differ; none is trusted wrongly
    # (the masks above are the truth).
    assert sum(s.status == "ok" for s in samples) >= len(samples) // 2, [
        (s.sample_id, s.flags) for s in samples]


def test_logprobs_prove_the_ids_without_the_servers_ids(family, tmp_path):
    samples, truth = infer_and_reconstruct(family, tmp_path, single_turns(6), "--no-stream",
                                           "--logprobs", blind=False, seed=2)
    for s in samples:
        record = truth[s.sample_id]
        # The raw log holds the server's ids too; strip them and the logprobs still prove it.
        assert s.input_ids[s.prompt_len:] == record["reference_completion_ids"]
    blind, truth = infer_and_reconstruct(family, tmp_path / "again", single_turns(6),
                                         "--no-stream", "--logprobs", blind=True, seed=2,
                                         keep_logprobs=True)
    for s in blind:
        assert s.input_ids[s.prompt_len:] == truth[s.sample_id]["reference_completion_ids"]
        assert s.evidence == "logprobs" and s.status == "ok", (s.sample_id, s.flags)
