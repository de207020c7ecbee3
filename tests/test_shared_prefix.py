"""actor.use_prefix_grouper (asyncrl.trainer.shared_prefix): each prompt group's shared prefix runs once and
its rows' suffixes against the expanded KV cache; log-probs, entropies, gradients and a whole update are the
plain forward's, in fewer tokens."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from asyncrl.agent_loop.base import AgentLoopOutput
from asyncrl.config import ExperimentConfig
from asyncrl.rollout.sampling import SamplingFilters
from asyncrl.trainer.engine import TrainEngine, collate
from asyncrl.trainer.logprobs import response_log_probs
from asyncrl.trainer.shared_prefix import prefix_plan, shared_prefix_log_probs
from asyncrl.trainer.update import actor_loss_fn


def _model(random_model_dir) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32)


def _groups(spec, seed=0, vocab=90):
    """``spec``: per group ``(prompt_len, [response lengths])``; row 1 of each group has two tool tokens."""
    rng = random.Random(seed)
    outs, gids = [], []
    for g, (p, resp) in enumerate(spec):
        prompt = [rng.randrange(3, vocab) for _ in range(p)]
        for k, r in enumerate(resp):
            mask = [1] * r
            if k == 1 and r > 4:
                mask[2:4] = [0, 0]
            outs.append(AgentLoopOutput(prompt, [rng.randrange(3, vocab) for _ in range(r)], mask, [-1.0 * x for x in mask],
                                        float(k % 2), response_versions=[0] * r))
            gids.append(f"uid-{g}")
    return collate(outs, gids)


SPEC = [(16, [3, 9, 5, 1]), (13, [6, 2, 8]), (18, [4, 4]), (15, [7])]  # prompts 13-18 tokens, a lone row, a 1-token response


def test_plan_shares_each_groups_prompt_up_to_the_token_before_its_first_response_token():
    b = _groups(SPEC)
    plan = prefix_plan(b.input_ids, b.attention_mask, b.resp_index, b.group_ids)
    assert plan.prefix_len.tolist() == [15, 12, 17, 14]  # prompt - 1: that token's logits predict the response
    assert plan.row_group.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 3]
    assert plan.leaders.tolist() == [0, 4, 7, 9]
    assert (plan.width, plan.suffix_width) == (17, 10)  # row 1: 16 + 9 tokens from column 15 on = 10
    # 4 groups x 17 + 10 rows x 10, against 10 rows x 25 columns
    assert plan.tokens == 4 * 17 + 10 * 10 < b.input_ids.numel() == 10 * 25


def test_plan_takes_the_prefix_all_rows_share_and_falls_back_when_nothing_is_shared():
    b = _groups([(12, [4, 4, 4])])
    b.input_ids[2, 8] = b.input_ids[0, 8] + 1  # row 2 leaves the group's prompt at column 8
    plan = prefix_plan(b.input_ids, b.attention_mask, b.resp_index, b.group_ids)
    assert plan.prefix_len.tolist() == [8]
    singles = _groups([(5, [3]), (5, [4])])
    assert prefix_plan(singles.input_ids, singles.attention_mask, singles.resp_index, singles.group_ids) is None
    one = _groups([(1, [3, 4])])  # a one-token prompt: no token before the response's predecessor
    assert prefix_plan(one.input_ids, one.attention_mask, one.resp_index, one.group_ids) is None
    left = _groups([(5, [3, 4])])
    left.attention_mask[0, 0] = 0  # padding before a real token: positions would differ from the plain forward
    assert prefix_plan(left.input_ids, left.attention_mask, left.resp_index, left.group_ids) is None


@pytest.mark.parametrize("sampling", [None, SamplingFilters(temperature=0.7, top_k=20)])
def test_log_probs_entropy_and_gradients_equal_the_plain_forward(random_model_dir, sampling):
    model = _model(random_model_dir)
    b = _groups(SPEC)
    plan = prefix_plan(b.input_ids, b.attention_mask, b.resp_index, b.group_ids)

    def run(f):
        model.zero_grad()
        lp, ent = f()
        ((lp * b.response_mask).sum() + 0.1 * (ent * b.response_mask).sum()).backward()
        return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    want = run(lambda: response_log_probs(model, b, sampling, with_entropy=True))
    got = run(lambda: shared_prefix_log_probs(model, b, plan, sampling, with_entropy=True))
    torch.testing.assert_close(got[0], want[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], want[1], atol=2e-5, rtol=1e-5)
    assert got[0][b.resp_index == 0].eq(0).all() and got[0][b.resp_index > 0].ne(0).all()
    for name, g in want[2].items():
        torch.testing.assert_close(got[2][name], g, atol=1e-5 * float(g.abs().max()) + 1e-9, rtol=1e-4, msg=name)


@pytest.mark.parametrize("micro", [64, 3])  # 3: groups split over micro-batches, each part runs its prefix
def test_an_update_with_the_grouper_equals_one_without_in_fewer_tokens(random_model_dir, micro):
    loss_fn = actor_loss_fn(ExperimentConfig())
    b = _groups(SPEC, seed=3)
    b.extras["advantages"] = torch.linspace(-1, 1, len(b))[:, None] * torch.ones_like(b.response_mask)
    b.extras["old_log_probs"] = b.rollout_log_probs.clone()
    engines = [TrainEngine(str(random_model_dir), lr=1e-2, warmup=0, total_updates=10, micro_batch_size=micro,
                           with_reference=True, use_prefix_grouper=on) for on in (False, True)]
    refs = [e.compute_ref_log_probs(b) for e in engines]
    olds = [e.compute_log_probs(b) for e in engines]
    torch.testing.assert_close(refs[1], refs[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(olds[1], olds[0], atol=2e-5, rtol=1e-5)
    out = [e.update(b, loss_fn) for e in engines]
    assert out[1]["perf/tokens"] < out[0]["perf/tokens"]
    assert out[1]["actor/pg_loss"] == pytest.approx(out[0]["actor/pg_loss"], abs=1e-5)
    for (name, p0), p1 in zip(engines[0].model.named_parameters(), engines[1].model.parameters()):
        scale = float(p0.grad.abs().max()) + 1e-12
        assert torch.allclose(p1.grad, p0.grad, atol=1e-5 * scale), name


def test_a_model_that_returns_no_kv_cache_is_refused_with_the_reason(random_model_dir):
    model = _model(random_model_dir)
    model.gradient_checkpointing_enable()
    model.train()  # transformers turns the cache off when checkpointing in training
    b = _groups(SPEC)
    plan = prefix_plan(b.input_ids, b.attention_mask, b.resp_index, b.group_ids)
    with pytest.raises(RuntimeError, match="gradient checkpointing"):
        shared_prefix_log_probs(model, b, plan)


def test_the_config_key_reaches_the_engine_on_by_default_with_the_cpu_strategy_only(random_model_dir):
    from asyncrl.config import load_config
    from asyncrl.config_schema import ConfigError
    from asyncrl.trainer.factory import build_cpu_train_engine
    from asyncrl.trainer.shared_prefix import uses_prefix_grouper

    key, model = "actor_rollout_ref.actor.use_prefix_grouper", f"actor_rollout_ref.model.path={random_model_dir}"
    assert build_cpu_train_engine(load_config(overrides=[model])).use_prefix_grouper is True
    assert build_cpu_train_engine(load_config(overrides=[model, f"{key}=false"])).use_prefix_grouper is False
    fsdp = ["actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=1"]
    assert not uses_prefix_grouper(load_config(overrides=fsdp))
    with pytest.raises(ConfigError, match="strategy=cpu only"):
        load_config(overrides=[f"{key}=true", *fsdp])


def _row(p, r):
    return AgentLoopOutput(p, r, [1] * len(r), [-1.0] * len(r), 1.0, response_versions=[0] * len(r))


def test_pad_columns_keep_positions_inside_a_learned_position_table(monkeypatch):
    """A tester's case: a long-prompt group beside a long-response one; the suffix pass's pad columns once got
    positions past the batch's length (IndexError in GPT-2's 64-position table)."""
    import asyncrl.trainer.shared_prefix as sp

    monkeypatch.setattr(sp, "MAX_TOKEN_RATIO", 10.0)  # run the plan even though it saves little here
    a, b_ = list(range(3, 43)), [5, 6]
    b = collate([_row(a, [7, 8]), _row(a, [9]), _row(b_, list(range(10, 50))), _row(b_, list(range(11, 49)))],
                ["A", "A", "B", "B"])
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=2,
                                                                 n_positions=64)).eval()
    plan = sp.prefix_plan(b.input_ids, b.attention_mask, b.resp_index, b.group_ids)
    with torch.no_grad():
        torch.testing.assert_close(sp.shared_prefix_log_probs(model, b, plan)[0], response_log_probs(model, b)[0],
                                   atol=2e-5, rtol=1e-5)


def test_a_plan_that_saves_too_little_runs_the_plain_forward():
    singles = collate([_row([3, 4, 5, 6], [7, 8, 9, 10, 11, 12]) for _ in range(2)]
                      + [_row([20 + i, 4, 5], list(range(30, 60))) for i in range(4)], ["p", "p", 1, 2, 3, 4])
    plan_tokens_would_be = 5 * 2 + 6 * 33  # one prefix row + every row from its prefix on, against 6 x 33
    assert plan_tokens_would_be > 0.75 * singles.input_ids.numel()
    assert prefix_plan(singles.input_ids, singles.attention_mask, singles.resp_index, singles.group_ids) is None


def test_a_rope_that_depends_on_the_length_runs_the_plain_forward(tmp_path):
    from asyncrl.trainer.shared_prefix import shares_prefix_exactly

    small = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=32)
    dynamic = transformers.LlamaConfig(**small, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert not shares_prefix_exactly(transformers.LlamaForCausalLM(dynamic))
    assert shares_prefix_exactly(transformers.LlamaForCausalLM(transformers.LlamaConfig(**small)))
    transformers.LlamaForCausalLM(dynamic).save_pretrained(tmp_path)
    engine = TrainEngine(str(tmp_path), lr=1e-3, warmup=0, total_updates=1, use_prefix_grouper=True)
    b = _groups(SPEC)
    assert engine._prefix_plan(b) is None and engine.use_prefix_grouper is False
