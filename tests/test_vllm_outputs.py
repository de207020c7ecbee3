"""asyncrl.rollout.vllm_outputs: the sampled logprobs and top-k read alike from vLLM's FlatLogprobs (what
VLLMEngine asks for) and from its per-position dicts; a layout that does not put the sampled token first is
refused. The engine's own outputs are checked against transformers in tests/test_vllm_backend.py."""

import pytest

pytest.importorskip("vllm")

from vllm.logprobs import FlatLogprobs, Logprob, append_logprobs_for_next_position  # noqa: E402

from asyncrl.rollout.vllm_outputs import sampled_logprobs, top_logprobs  # noqa: E402

# (sampled id, its logprob, its rank), then the top-2 (ids, logprobs) of each position, as vLLM's sampler lists them
POSITIONS = [
    (7, -0.1, 1, [7, 3], [-0.1, -2.5]),
    (3, -2.5, 2, [7, 3], [-0.1, -2.5]),   # sampled the second most likely: it is in the top-2 too
    (9, -6.0, 40, [1, 2], [-0.2, -1.9]),  # sampled far down: not in the top-2
]


def both_forms():
    flat, dicts = FlatLogprobs(), []
    for tok, lp, rank, top_ids, top_lps in POSITIONS:
        for container in (flat, dicts):
            append_logprobs_for_next_position(container, [tok, *top_ids], [lp, *top_lps], [None] * 3, rank, 2)
    return flat, dicts


def test_flat_and_dict_logprobs_give_the_same_sampled_logprobs_and_top_k():
    flat, dicts = both_forms()
    ids = [p[0] for p in POSITIONS]
    assert sampled_logprobs(ids, flat) == sampled_logprobs(ids, dicts) == [-0.1, -2.5, -6.0]
    want = [[(7, -0.1), (3, -2.5)], [(7, -0.1), (3, -2.5)], [(1, -0.2), (2, -1.9)]]
    assert top_logprobs(flat, 2) == top_logprobs(dicts, 2) == want
    assert top_logprobs(flat, 1) == [[(7, -0.1)], [(7, -0.1)], [(1, -0.2)]]


def test_a_flat_layout_without_the_sampled_token_first_is_refused():
    flat, _ = both_forms()
    with pytest.raises(ValueError, match="sampled token"):
        sampled_logprobs([7, 7, 9], flat)  # position 1 starts with 3
    with pytest.raises(ValueError, match="3 positions and 4 tokens"):
        sampled_logprobs([7, 3, 9, 4], flat)  # one more token than positions


def test_dict_form_reads_the_sampled_tokens_entry():
    dicts = [{5: Logprob(-0.3, 1), 6: Logprob(-1.4, 2)}]
    assert sampled_logprobs([6], dicts) == [-1.4]


def test_an_empty_position_or_a_count_mismatch_is_refused_in_either_form():
    flat = FlatLogprobs()
    append_logprobs_for_next_position(flat, [], [], [], 1, 0)  # a position without its sampled token
    append_logprobs_for_next_position(flat, [4], [-1.0], [None], 1, 0)
    with pytest.raises(ValueError, match="sampled token"):
        sampled_logprobs([4, 4], flat)  # would read position 1's entry for position 0
    with pytest.raises(ValueError, match="2 positions and 3 tokens"):
        sampled_logprobs([1, 2, 3], [{1: Logprob(-0.1, 1)}, {2: Logprob(-0.2, 1)}])
