"""Losses and their aggregation: hand-worked values, and the same gradient under any micro-batch split.

The issue's case: 4 responses of 2, 9, 3 and 6 model tokens, advantages +1, -1, +0.5, -0.5, ratio 1.
With ratio 1 the PPO loss of token t of response i is ``-A_i * ratio``, so ``d loss / d logp_it`` is
``-A_i`` times the aggregation weight of that token:

  token-mean               1 / T            (T = 20 tokens)
  seq-mean-token-mean      1 / (N n_i)      (N = 4 sequences, n_i the response's tokens)
  seq-mean-token-sum       1 / N
  seq-mean-token-sum-norm  1 / (N L)        (L = loss_scale_factor = 10 here)
"""

import math

import pytest
import torch

from asyncrl.agent_loop.base import AgentLoopOutput
from asyncrl.config_algorithm import LOSS_AGG_MODES
from asyncrl.trainer.engine import Batch, TrainEngine, collate
from asyncrl.trainer.losses import LossScale, agg_loss, kl_penalty, ppo_clip_loss_mat, value_loss_mat

LENGTHS = [2, 9, 3, 6]
ADV = [1.0, -1.0, 0.5, -0.5]
L = 10.0


def _mask():
    m = torch.zeros(4, 9, dtype=torch.float64)
    for i, n in enumerate(LENGTHS):
        m[i, :n] = 1
    return m


def _weight(mode, i):
    n = LENGTHS[i]
    return {"token-mean": 1 / 20, "seq-mean-token-mean": 1 / (4 * n), "seq-mean-token-sum": 1 / 4,
            "seq-mean-token-sum-norm": 1 / (4 * L)}[mode]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("split", [[[0, 1, 2, 3]], [[0], [1], [2], [3]], [[0, 2], [1, 3]], [[3], [0, 1, 2]]])
def test_hand_gradient_under_any_split(mode, split):
    mask = _mask()
    logp = torch.zeros(4, 9, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor(ADV, dtype=torch.float64)
    scale = LossScale.of(mask)
    assert (scale.tokens, scale.seqs) == (20.0, 4.0)
    for rows in split:
        mat, _ = ppo_clip_loss_mat(logp[rows], logp[rows].detach(), adv[rows], mask[rows])
        agg_loss(mat, mask[rows], mode, scale, L).backward()
    want = torch.zeros(4, 9, dtype=torch.float64)
    for i, n in enumerate(LENGTHS):
        want[i, :n] = -ADV[i] * _weight(mode, i)
    assert torch.allclose(logp.grad, want, rtol=1e-12, atol=0)


def test_agg_loss_values_and_errors():
    loss = torch.tensor([[1.0, 3.0, 100.0], [2.0, 0.0, 0.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2: no tokens, not a sequence
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(2.0)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=3).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        agg_loss(loss, mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="valid"):
        agg_loss(loss, mask, "nope")


def test_ppo_clip_higher_and_dual_clip():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[2.0, 0.5, 5.0]])).requires_grad_()
    # A = +1: ratio 2 clipped at 1.28 -> -1.28; A = -1: ratio .5 clipped at .8 -> +0.8 (max of .5, .8);
    # A = -1, ratio 5: PPO gives +5, dual clip caps it at clip_ratio_c = 3
    mat, m = ppo_clip_loss_mat(new, old, torch.tensor([[1.0, -1.0, -1.0]]), torch.ones(1, 3), 0.2, 0.28, 3.0)
    assert mat.tolist()[0] == pytest.approx([-1.28, 0.8, 3.0])
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 3) and m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 3)
    mat.sum().backward()
    assert new.grad.abs().sum() == 0  # every token clipped -> no gradient
    mat_nodual, _ = ppo_clip_loss_mat(new, old, torch.tensor([[1.0, -1.0, -1.0]]), torch.ones(1, 3), 0.2, 0.28, None)
    assert mat_nodual[0, 2].item() == pytest.approx(5.0)


def test_kl_estimators_by_hand():
    logp, ref = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]]))
    d = math.log(2.0)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * d * d)
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(0.5 + d - 1.0)  # r = .5, r - log r - 1
    assert kl_penalty(logp, ref, "abs").item() == pytest.approx(d)
    assert kl_penalty(logp, logp, "k3").item() == 0.0
    with pytest.raises(ValueError, match="valid"):
        kl_penalty(logp, ref, "k4")


def test_clipped_value_loss_by_hand():
    v, ret, old = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, 0.0]])
    mat, m = value_loss_mat(v, ret, old, torch.ones(1, 2), 0.5)
    # token 0: (2-0)^2=4 vs clipped (0.5-0)^2=.25 -> max 4 -> 2; token 1: (0-1)^2=1 vs (0-1)^2 -> .5
    assert mat.tolist()[0] == pytest.approx([2.0, 0.5])
    assert m["critic/vf_clipfrac"] == 0.0


# ---------------------------------------------------------------------- the real engine, float64
def _batch(prompt_lens=(3, 5, 2, 4)) -> Batch:
    g = torch.Generator().manual_seed(0)
    outs = []
    for p, n in zip(prompt_lens, LENGTHS):
        ids = torch.randint(3, 90, (p + n,), generator=g).tolist()
        mask = [1] * n
        if n == 9:
            mask[4] = 0  # a tool token inside the response: not trained, not counted
        outs.append(AgentLoopOutput(ids[:p], ids[p:], mask, [0.0 if k == 0 else -1.0 for k in mask],
                                    response_versions=[0] * n))
    return collate(outs, ["a", "a", "b", "b"])


def _pad(batch: Batch, extra: int) -> Batch:
    """The same rows with ``extra`` more padding columns (sequence and response)."""
    def z(t, fill=0):
        return torch.cat([t, torch.full((t.shape[0], extra), fill, dtype=t.dtype)], 1)

    out = Batch(z(batch.input_ids), z(batch.attention_mask), z(batch.resp_index), z(batch.response_mask),
                z(batch.rollout_log_probs), batch.rewards, list(batch.group_ids), z(batch.response_versions, -1))
    out.extras = {k: z(v) if v.dim() == 2 else v for k, v in batch.extras.items()}
    return out


def _grad(engine: TrainEngine, batch: Batch, mode: str, micro: int) -> torch.Tensor:
    from types import SimpleNamespace

    from asyncrl.trainer.update import actor_loss_fn

    cfg = SimpleNamespace(actor_rollout_ref=SimpleNamespace(
        actor=SimpleNamespace(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode,
                              loss_scale_factor=L, entropy_coeff=0.0, use_kl_loss=False, kl_loss_coef=0.0,
                              kl_loss_type="k3"),
        rollout=SimpleNamespace(response_length=24)))
    engine.micro_batch_size = micro
    engine.update(batch, actor_loss_fn(cfg))
    return torch.cat([p.grad.flatten() for p in engine.model.parameters() if p.grad is not None])


@pytest.fixture(scope="module")
def engine64(random_model_dir):
    eng = TrainEngine(str(random_model_dir), lr=0.0, warmup=0, total_updates=10, clip_grad=1e12, dtype="float64")
    return eng


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_engine_gradient_same_for_every_micro_batch_split_and_padding(engine64, mode):
    batch = _batch()
    batch.extras["old_log_probs"] = engine64.compute_log_probs(batch)  # ratio 1
    batch.extras["advantages"] = torch.tensor(ADV, dtype=torch.float64)
    ref = _grad(engine64, batch, mode, 4)
    assert ref.abs().max() > 1e-6  # a real gradient, not zeros
    for micro in (1, 2, 3):
        g = _grad(engine64, batch, mode, micro)
        assert float((g - ref).norm() / ref.norm()) < 1e-6, (mode, micro)
    padded = _pad(batch, 5)
    g = _grad(engine64, padded, mode, 3)
    assert float((g - ref).norm() / ref.norm()) < 1e-6, (mode, "padding")


def test_filtered_log_probs_keep_the_loss_finite(engine64):
    """Under top-p a tool token (mask 0) or a rare sampled token is outside the kept set on both sides
    (old and current, current and reference): the loss and gradient must stay finite (no inf - inf)."""
    from asyncrl.rollout.sampling import LOGP_FLOOR, SamplingFilters

    batch = _batch()
    engine64.sampling = SamplingFilters(1.0, -1, 0.3, 0.0)
    try:
        old = engine64.compute_log_probs(batch)
        assert (old <= LOGP_FLOOR).any()  # random tokens: many are outside a 0.3 nucleus
        batch.extras.update(old_log_probs=old, advantages=torch.tensor(ADV, dtype=torch.float64), ref_log_probs=old)
        from types import SimpleNamespace

        from asyncrl.trainer.update import actor_loss_fn

        cfg = SimpleNamespace(actor_rollout_ref=SimpleNamespace(
            actor=SimpleNamespace(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean",
                                  loss_scale_factor=None, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1,
                                  kl_loss_type="low_var_kl"),
            rollout=SimpleNamespace(response_length=24)))
        m = engine64.update(batch, actor_loss_fn(cfg), with_entropy=True)
        assert all(math.isfinite(v) for v in m.values()), {k: v for k, v in m.items() if not math.isfinite(v)}
        assert all(torch.isfinite(p.grad).all() for p in engine64.model.parameters() if p.grad is not None)
    finally:
        engine64.sampling = None
