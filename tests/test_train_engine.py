"""TrainEngine micro-batching: fixed and dynamic (token-budget) chunks, trimmed of padding, give the
same update as one full-batch pass."""

import random

import torch

from asyncrl.agent_loop.base import AgentLoopOutput
from asyncrl.config import ExperimentConfig
from asyncrl.trainer.engine import TrainEngine, collate, micro_batches
from asyncrl.trainer.update import actor_loss_fn


def _batch(n=12, seed=0):
    rng = random.Random(seed)
    outs = []
    for i in range(n):
        p = [rng.randrange(1, 90) for _ in range(rng.randint(3, 6))]
        r = [rng.randrange(1, 90) for _ in range(rng.choice([2, 3, 5, 40]))]  # long-tail lengths
        outs.append(AgentLoopOutput(prompt_ids=p, response_ids=r, response_mask=[1] * len(r),
                                    response_logprobs=[-1.0] * len(r), reward_score=float(i % 2),
                                    response_versions=[0] * len(r)))
    b = collate(outs, [i // 4 for i in range(n)])
    b.extras["advantages"] = torch.linspace(-1, 1, n)
    b.extras["old_log_probs"] = b.rollout_log_probs.clone()
    return b


def test_micro_batches_cover_every_row_once_and_drop_padding():
    b = _batch()
    fixed = micro_batches(b, 5)
    assert [idx for idx, _ in fixed] == [list(range(5)), list(range(5, 10)), [10, 11]]
    dyn = micro_batches(b, 5, max_token_len=60)
    assert sorted(i for idx, _ in dyn for i in idx) == list(range(len(b)))
    for idx, mb in dyn:
        assert len(idx) * mb.input_ids.shape[1] <= max(60, mb.input_ids.shape[1])  # budget (one row at least)
        assert mb.attention_mask[:, -1].any() and (mb.resp_index > 0)[:, -1].any()  # no all-padding column
        assert mb.extras["old_log_probs"].shape == mb.response_mask.shape
        assert torch.equal(mb.input_ids[0], b.input_ids[idx[0], :mb.input_ids.shape[1]])
    assert sum(len(i) * mb.input_ids.shape[1] for i, mb in dyn) < len(b) * b.input_ids.shape[1] / 2


def test_dynamic_micro_batches_give_the_same_update(random_model_dir):
    loss_fn = actor_loss_fn(ExperimentConfig())
    engines = [TrainEngine(str(random_model_dir), lr=1e-2, warmup=0, total_updates=10, micro_batch_size=m,
                           max_token_len=t, with_reference=True) for m, t in ((64, None), (3, None), (64, 50))]
    refs = [e.compute_ref_log_probs(_batch()) for e in engines]
    assert torch.allclose(refs[0], refs[1], atol=1e-5) and torch.allclose(refs[0], refs[2], atol=1e-5)
    for e in engines:
        e.update(_batch(), loss_fn)
    # the accumulated gradients agree (the first Adam step is ~lr*sign(grad), which would magnify
    # float rounding in near-zero entries, so the gradients are compared rather than the weights)
    grads = [{n: p.grad for n, p in e.model.named_parameters()} for e in engines]
    for name, g in grads[0].items():
        scale = float(g.abs().max()) + 1e-12
        for other in grads[1:]:
            assert torch.allclose(g, other[name], atol=1e-5 * scale), name
