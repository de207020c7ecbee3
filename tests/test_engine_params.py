"""Real engines honour the request parameters the proxy passes on (issue 13 item 3): stop strings end
generation where the text first contains one, ``top_logprobs`` are the engine's real top-k of the
same distribution as the sampled token's logprob, penalties run on vLLM and are refused by name on
the HF backend. HF runs in process; vLLM is the session's shared replica.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import EMBEDDED_MODEL, embedded_model_ready

from asyncrl.rollout.base import SamplingParams, UnsupportedSamplingParam

pytestmark = pytest.mark.skipif(not embedded_model_ready(), reason="embedded model not built")


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(EMBEDDED_MODEL)


@pytest.fixture(scope="module")
def prompt(tok):
    return tok.apply_chat_template([{"role": "user", "content": "What is 47+38?"}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def hf():
    from asyncrl.rollout.hf_backend import HFEngine

    eng = HFEngine(str(EMBEDDED_MODEL))
    asyncio.run(eng.start())
    return lambda rid, p, sp: asyncio.run(eng.generate(rid, p, sp))


@pytest.fixture()
def vllm(shared_replica):
    return shared_replica.generate


def _check_stop_and_top(generate, tok, prompt):
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    full = generate("full", prompt, greedy)
    text = tok.decode(full.token_ids)
    assert len(full.token_ids) == 24
    stop = text[6:8]  # two characters from the middle of what the model writes anyway
    first = text.find(stop)
    out = generate("stop", prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop]))
    # ids end with the token completing the first occurrence; nothing after it was generated
    assert out.stop_reason == "completed" and out.token_ids == full.token_ids[:len(out.token_ids)]
    assert stop in tok.decode(out.token_ids) and stop not in tok.decode(out.token_ids[:-1])
    assert len(tok.decode(out.token_ids)) >= first + len(stop) and len(out.token_ids) < 24
    assert len(out.log_probs) == len(out.token_ids)

    top = generate("top", prompt, SamplingParams(max_tokens=8, temperature=0.0, top_logprobs=3))
    assert top.top_logprobs is not None and len(top.top_logprobs) == len(top.token_ids)
    for tid, lp, alts in zip(top.token_ids, top.log_probs, top.top_logprobs):
        assert len(alts) == 3 and [a[1] for a in alts] == sorted((a[1] for a in alts), reverse=True)
        assert alts[0][0] == tid and alts[0][1] == pytest.approx(lp, abs=1e-4)  # greedy: the best is sampled
        assert len({a[0] for a in alts}) == 3
    sampled = generate("top-t", prompt, SamplingParams(max_tokens=8, temperature=0.7, seed=1, top_logprobs=2))
    for tid, lp, alts in zip(sampled.token_ids, sampled.log_probs, sampled.top_logprobs):
        assert alts[0][1] >= lp - 1e-4  # the same distribution: nothing beats the best
        if tid in dict(alts):
            assert dict(alts)[tid] == pytest.approx(lp, abs=1e-4)
    none = generate("no-top", prompt, SamplingParams(max_tokens=2, temperature=0.0))
    assert none.top_logprobs is None


def test_hf_engine_stop_strings_and_top_logprobs(hf, tok, prompt):
    _check_stop_and_top(hf, tok, prompt)


def test_hf_engine_refuses_penalties_by_name(hf, prompt):
    for name, value in (("presence_penalty", 0.5), ("frequency_penalty", -0.5), ("repetition_penalty", 1.2)):
        with pytest.raises(UnsupportedSamplingParam, match=name) as info:
            hf("pen", prompt, SamplingParams(max_tokens=2, **{name: value}))
        assert info.value.param == name


@pytest.mark.vllm
@pytest.mark.e2e
def test_vllm_engine_stop_strings_top_logprobs_and_penalties(vllm, tok, prompt):
    _check_stop_and_top(vllm, tok, prompt)
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = vllm("pen-0", prompt, greedy).token_ids
    penalised = vllm("pen-1", prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                                     repetition_penalty=5.0)).token_ids
    assert len(penalised) == 24 and penalised != plain  # the penalty reached the sampler
