"""The one sampling transform: hand-worked filters, the HF sampler, and vLLM's rollout log-probs vs the trainer's.

Probabilities of the 5-token case ``[2, 1, 0.5, 0, -1]``: softmax = .5630 .2071 .1256 .0762 .0280.
"""

import math

import numpy as np
import pytest
import torch

from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.hf_sampler import sample, seeded_uniforms
from asyncrl.rollout.sampling import (LOGP_FLOOR, SamplingFilters, apply_sampling_filters, filtered_entropy,
                                      token_log_probs)

X = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
INF = -math.inf


def kept(t):
    return [i for i, v in enumerate(t.tolist()) if v != INF]


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # ascending cumulative mass .028 .104 .230 .437 1.0; drop while <= 1 - 0.7 = 0.3
    assert kept(apply_sampling_filters(X, 1.0, top_p=0.7)) == [0, 1]
    assert kept(apply_sampling_filters(X, 1.0, top_p=0.5)) == [0]  # the top token alone has .563 >= .5
    assert kept(apply_sampling_filters(X, 1.0, top_p=0.9)) == [0, 1, 2, 3]  # only .028 <= .1 is dropped


def test_top_k_and_min_p():
    assert kept(apply_sampling_filters(X, 1.0, top_k=2)) == [0, 1]
    assert kept(apply_sampling_filters(torch.tensor([1.0, 3.0, 1.0, 0.0]), 1.0, top_k=2)) == [0, 1, 2]  # ties kept
    assert kept(apply_sampling_filters(X, 1.0, min_p=0.3)) == [0, 1]  # floor .3 x .563 = .169
    assert kept(apply_sampling_filters(X, 1.0, min_p=0.2)) == [0, 1, 2]  # floor .113


def test_order_temperature_then_top_k_then_top_p():
    # T=2: logits 1 .5 .25 0 -.5; top-3 -> softmax .481 .292 .227; drop cumulative <= .5 -> .227 dropped
    out = apply_sampling_filters(X, 2.0, top_k=3, top_p=0.5)
    assert kept(out) == [0, 1]
    assert out[0].item() == pytest.approx(1.0) and out[1].item() == pytest.approx(0.5)
    lp = torch.log_softmax(out, -1)
    assert lp[0].item() == pytest.approx(math.log(math.e / (math.e + math.exp(0.5))))


def test_greedy_and_identity_pass_through():
    assert torch.equal(apply_sampling_filters(X, 0.0, top_k=2, top_p=0.5), X)  # vLLM greedy: raw logits
    assert torch.equal(apply_sampling_filters(X, 1.0), X)
    with pytest.raises(ValueError, match="top_p"):
        apply_sampling_filters(X, 1.0, top_p=0.0)


def test_log_probs_gradient_only_through_kept_tokens():
    logits = X.clone().repeat(2, 1).requires_grad_()
    lp = token_log_probs(logits, torch.tensor([1, 3]), SamplingFilters(1.0, -1, 0.7, 0.0))
    assert lp[0].item() == pytest.approx(math.log(0.2071 / (0.5630 + 0.2071)), abs=1e-4)
    assert lp[1].item() == LOGP_FLOOR  # token 3 is outside the nucleus: a finite floor, not -inf
    both = token_log_probs(logits.detach(), torch.tensor([3, 3]), SamplingFilters(1.0, -1, 0.7, 0.0))
    assert float(both[0] - both[1]) == 0.0  # two such log-probs differ by 0, not NaN
    lp[0].backward()
    assert torch.all(logits.grad[0, 2:] == 0) and logits.grad[0, 1] > 0 and torch.all(logits.grad[1] == 0)
    ent = filtered_entropy(X, SamplingFilters(1.0, 2, 1.0, 0.0))
    p = torch.softmax(X[:2], -1)
    assert ent.item() == pytest.approx(float(-(p * p.log()).sum()), rel=1e-6)


def test_hf_sampler_reports_filtered_log_probs_and_respects_the_filter():
    n = 200
    u = torch.from_numpy(seeded_uniforms(np.arange(n, dtype=np.uint64), np.zeros(n, dtype=np.int64)))
    toks, lps, _ = sample(X.repeat(n, 1), u, torch.zeros(n, dtype=torch.long), ((1.0, -1, 0.7, 0.0),), plain=True)
    want = torch.log_softmax(apply_sampling_filters(X, 1.0, top_p=0.7), -1)
    assert set(toks.tolist()) == {0, 1}
    torch.testing.assert_close(lps, want[toks])
    tok, lp, _ = sample(X[None], u[:1], torch.tensor([-1]), (), plain=False)  # greedy row: argmax, raw log-prob
    assert tok.item() == 0 and lp.item() == pytest.approx(float(torch.log_softmax(X, -1)[0]))


# ---------------------------------------------------------------------- against the real vLLM engine
SETTINGS = [  # temperature, top_k, top_p, min_p
    (1.0, -1, 1.0, 0.0),
    (1.0, -1, 0.7, 0.0),
    (0.7, 8, 1.0, 0.0),
    (1.2, -1, 1.0, 0.1),
    (0.9, 20, 0.8, 0.05),
]


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.parametrize("temperature,top_k,top_p,min_p", SETTINGS)
def test_vllm_rollout_log_probs_equal_trainer_log_probs(shared_replica, model_dir, temperature, top_k, top_p, min_p):
    """The trainer's recomputation (TrainEngine, same weights) reproduces vLLM's processed log-probs."""
    from asyncrl.agent_loop.base import AgentLoopOutput
    from asyncrl.agent_loop.single_turn import render_prompt_ids
    from asyncrl.models import load_tokenizer
    from asyncrl.trainer.engine import TrainEngine, collate

    tok = load_tokenizer(str(model_dir))
    prompt = render_prompt_ids(tok, [{"role": "user", "content": "12+34="}], None)
    sp = SamplingParams(max_tokens=16, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=7,
                        ignore_eos=True)
    outs = [shared_replica.generate(f"sp-{temperature}-{top_k}-{top_p}-{min_p}-{i}", prompt,
                                    SamplingParams(**{**sp.__dict__, "seed": 7 + i})) for i in range(4)]
    sampling = SamplingFilters(temperature, top_k, top_p, min_p)
    engine = TrainEngine(str(model_dir), lr=0.0, warmup=0, total_updates=1, sampling=sampling)
    rows = [AgentLoopOutput(list(prompt), o.token_ids, [1] * len(o.token_ids), list(o.log_probs),
                            response_versions=list(o.response_versions)) for o in outs]
    batch = collate(rows, list(range(len(rows))))
    trainer_lp = engine.compute_log_probs(batch)
    m = batch.response_mask > 0
    diff = (trainer_lp - batch.rollout_log_probs)[m].abs()
    assert (trainer_lp[m] > LOGP_FLOOR).all(), "a sampled token is outside the trainer's filtered support"
    assert diff.max() < 2e-3, (diff.max(), temperature, top_k, top_p, min_p)
    if top_p < 1.0 or top_k > 0 or min_p > 0:
        # the filters matter: without them the trainer's log-probs are lower (mass of the dropped tail)
        plain = TrainEngine(str(model_dir), lr=0.0, warmup=0, total_updates=1,
                            sampling=SamplingFilters(temperature)).compute_log_probs(batch)
        assert (batch.rollout_log_probs - plain)[m].max() > 1e-3


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", SETTINGS + [(0.5, 3, 0.9, 0.2), (1.0, 50, 0.3, 0.0)])
def test_same_filters_as_vllms_sampler_code(temperature, top_k, top_p, min_p):
    """vLLM's own functions (no engine): temperature -> MinPLogitsProcessor.apply -> apply_top_k_top_p."""
    pytest.importorskip("vllm")
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 200, generator=g) * 3
    x = logits.clone() / temperature
    if min_p > 0:
        proc = MinPLogitsProcessor.__new__(MinPLogitsProcessor)
        proc.min_p_count, proc.min_p = 1, torch.full((64, 1), min_p)
        x = proc.apply(x)
    k = torch.full((64,), top_k, dtype=torch.long) if top_k > 0 else None
    p = torch.full((64,), top_p) if top_p < 1.0 else None
    want = torch.log_softmax(apply_top_k_top_p_pytorch(x, k, p), -1)
    got = torch.log_softmax(apply_sampling_filters(logits, temperature, top_k, top_p, min_p), -1)
    assert torch.equal(torch.isinf(got), torch.isinf(want))  # the same kept set, token for token
    kept = ~torch.isinf(want)
    assert torch.allclose(got[kept], want[kept], atol=1e-6)
