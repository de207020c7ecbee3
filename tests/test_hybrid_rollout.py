"""verl's hybrid engine with the hf backend on CPU: the rollout inside the trainer process, over the
actor's own module (``asyncrl/trainer/hybrid_rollout.py``)."""

from __future__ import annotations

import asyncio

import pytest
import ray
import torch

from asyncrl.rollout.base import SamplingParams
from asyncrl.trainer.hybrid_rollout import QueueForward, RolloutForward, SharedModuleHFEngine, SharedWeightsSender, in_process_rollout


def _greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_shared_engine_serves_the_trained_module_after_adopt_weights(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    engine = SharedModuleHFEngine(model, str(model_dir), max_num_seqs=4, max_model_len=64, seed=0)
    q = model.model.layers[0].self_attn.q_proj.weight
    fused = engine._fused[0][0]
    # the actor's parameters keep their own storage (optimizer steps and checkpoints see plain tensors)
    assert q.requires_grad and q.untyped_storage().data_ptr() != fused.untyped_storage().data_ptr()
    sp = SamplingParams(max_tokens=6, temperature=0.0, logprobs=True, ignore_eos=True)
    prompt = [5, 6, 7, 8]

    async def run() -> tuple:
        before = await engine.generate("a", prompt, sp)
        with torch.no_grad():  # a training step changes the module
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        stats = await SharedWeightsSender(engine).send(7)
        after = await engine.generate("b", prompt, sp)
        return before, stats, after

    before, stats, after = asyncio.run(run())
    assert "sync/refresh_s" in stats and engine.param_version == 7
    assert after.response_versions == [7] * 6
    assert after.token_ids == _greedy_reference(model, prompt, 6)  # the new weights, q/k/v and mlp included
    assert after.token_ids != before.token_ids
    assert q.grad is None  # generation left no autograd state on the actor's parameters


def test_in_process_rollout_is_chosen_by_config():
    from asyncrl.config import load_config

    base = ["actor_rollout_ref.hybrid_engine=true", "async_training.staleness_threshold=0",
            "actor_rollout_ref.rollout.agent.num_workers=0"]
    assert in_process_rollout(load_config(overrides=base + ["actor_rollout_ref.rollout.name=hf"]))
    assert not in_process_rollout(load_config(overrides=base + ["actor_rollout_ref.rollout.name=vllm"]))
    assert not in_process_rollout(load_config(overrides=["actor_rollout_ref.rollout.name=hf"]))  # async modes
    assert not in_process_rollout(load_config(overrides=base[:2] + ["actor_rollout_ref.rollout.name=hf",
                                                                     "actor_rollout_ref.rollout.agent.num_workers=1"]))


@pytest.mark.e2e
def test_hybrid_engine_hf_trains_in_the_trainer_process(ray_session, tmp_path):
    """`hybrid_engine=True` + `rollout.name=hf`: no replica or rollouter actor; every token on-policy,
    the accounting balances, the sync moves nothing, and a checkpoint of the shared module saves."""
    from asyncrl.experiment import Experiment
    from asyncrl.recipes import smoke_cpu
    from asyncrl.staleness import sample_budget

    cfg = smoke_cpu("a")
    cfg.actor_rollout_ref.hybrid_engine = True
    cfg.actor_rollout_ref.rollout.name = "hf"
    cfg.trainer.total_training_steps = 3
    cfg.trainer.test_freq = 0
    cfg.trainer.save_freq = 3
    cfg.trainer.default_local_dir = str(tmp_path)
    cfg.trainer.progress_bar = False
    exp = Experiment(cfg)
    try:
        exp.start()
        assert isinstance(exp.rollouter, RolloutForward) and exp.replicas == {}
        assert isinstance(exp.mq.actor, QueueForward)  # the queue body is the trainer's too: no queue actor
        summary = exp.wait(progress=False)
        history = ray.get(exp.trainer.status.remote())["history"]
        queue = exp.status()["message_queue"]  # its counters reach the driver through the trainer
        trajectories = ray.get(exp.rollouter.trajectories.remote(8))
    finally:
        exp.stop()
    acc = summary.accounting
    assert acc["balanced"] and acc["failed_total"] == 0, acc
    assert acc["trained"] == 3 * sample_budget(cfg).required_samples
    assert queue["gets"] == acc["trained"] and queue["puts"] >= queue["gets"] and queue["shutdown"], queue
    assert summary.param_version == 3 and set(summary.lag_counts) == {0}  # every token on-policy
    assert all(r["timing/gen_s"] > 0 and "sync/refresh_s" in r for r in history), history[-1]
    assert trajectories and summary.accuracy_after is not None  # the final evaluation ran on the shared engine
    assert summary.last_checkpoint and "global_step_3" in summary.last_checkpoint
    # an Experiment runs once (session 30: a start after stop cut the finished run's metrics.csv to its header)
    rows = (tmp_path / exp.name / "metrics.csv").read_text()
    with pytest.raises(RuntimeError, match=r"was already started and stopped: an Experiment runs once"):
        exp.start()
    with pytest.raises(RuntimeError, match=r"Experiment.wait\(\) after stop\(\): the run's actors are gone"):
        exp.wait(progress=False)
    assert exp.status() == {"state": "stopped", "name": exp.name, "run_dir": str(exp.run_dir), "finished": True}
    assert (tmp_path / exp.name / "metrics.csv").read_text() == rows and len(rows.splitlines()) == 4


@pytest.mark.e2e
def test_a_colocated_run_resumed_inside_a_sync_window_generates_the_rest_of_it(ray_session, tmp_path):
    """s36's tester: with trigger_parameter_sync_step=2 a colocated run checkpointed after step 1 resumed into a step
    whose batch no round would make (a round generated only at a window's start, and the groups queued at the save
    are not restored): it waited until trainer.total_time_s stopped it. The rest of the window is generated now."""
    from asyncrl.experiment import Experiment
    from asyncrl.recipes import smoke_cpu
    from asyncrl.staleness import sample_budget

    cfg = smoke_cpu("a")
    cfg.actor_rollout_ref.hybrid_engine = True
    cfg.actor_rollout_ref.rollout.name = "hf"
    cfg.async_training.trigger_parameter_sync_step = 2
    cfg.trainer.total_training_steps, cfg.trainer.save_freq, cfg.trainer.test_freq = 1, 1, 0
    cfg.trainer.default_local_dir, cfg.trainer.progress_bar = str(tmp_path), False
    first = Experiment(cfg)
    assert first.run().steps == 1
    cfg.trainer.total_training_steps, cfg.trainer.total_time_s = 3, 120.0  # the bound a hang would hit
    resumed = Experiment(cfg)
    assert resumed.resume_from is not None and resumed.resume_from.name == "global_step_1"
    try:
        resumed.start()
        summary = resumed.wait(progress=False)
    finally:
        resumed.stop()
    assert summary.steps == 3 and "total_training_steps=3 reached" in summary.stop_reason, summary.stop_reason
    acc = summary.accounting
    assert acc["balanced"] and acc["trained"] == 3 * sample_budget(cfg).required_samples, acc  # the whole run's


def test_skipping_zero_advantage_rows_gives_the_same_update(model_dir):
    """GRPO groups whose responses all scored alike carry no gradient: the engine leaves them out of the
    forward / backward, and the optimizer step is the same as with them (the step's normalisers count them)."""
    import random

    from asyncrl.agent_loop.base import AgentLoopOutput
    from asyncrl.recipes import arith_grpo_cpu
    from asyncrl.trainer.advantages import compute_advantages
    from asyncrl.trainer.engine import TrainEngine, collate, rows_with_gradient
    from asyncrl.trainer.update import actor_loss_fn

    cfg = arith_grpo_cpu()
    rng = random.Random(0)
    outs = []
    for g in range(6):  # groups 0, 2, 4 all wrong or all right: zero advantage
        for _ in range(4):
            n = rng.randint(3, 9)
            reward = float(g % 4 == 0) if g % 2 == 0 else float(rng.random() < 0.5)
            outs.append(AgentLoopOutput(prompt_ids=[rng.randint(3, 60) for _ in range(5)],
                                        response_ids=[rng.randint(3, 60) for _ in range(n)], response_mask=[1] * n,
                                        response_logprobs=[-2.0] * n, reward_score=reward, response_versions=[0] * n))
    outs[5].reward_score = 1.0 - outs[4].reward_score  # group 1 surely has signal
    batch = collate(outs, [g for g in range(6) for _ in range(4)])
    adv, ret = compute_advantages("grpo", batch.rewards[:, None] * batch.response_mask, batch.response_mask,
                                  batch.group_ids, cfg.algorithm, None)
    batch.extras.update(old_log_probs=batch.rollout_log_probs, advantages=adv, returns=ret)
    kept = rows_with_gradient(batch)
    assert 4 <= len(kept) < len(batch)
    engines = [TrainEngine(str(model_dir), lr=1e-2, warmup=0, total_updates=10, micro_batch_size=5, skip_zero_advantage=s)
               for s in (False, True)]
    metrics = [e.update(batch, actor_loss_fn(cfg)) for e in engines]
    for m, rows in zip(metrics, (batch, kept)):  # tokens through the model: micro-batches of 5 rows x their longest
        lengths = rows.attention_mask.sum(-1).tolist()
        assert m["perf/tokens"] == sum(len(lengths[i:i + 5]) * max(lengths[i:i + 5]) for i in range(0, len(lengths), 5))
        assert m["perf/step_s"] > 0
    assert metrics[1]["perf/tokens"] < metrics[0]["perf/tokens"]
    assert metrics[0]["actor/grad_norm"] == pytest.approx(metrics[1]["actor/grad_norm"], rel=1e-5)
    for (name, a), (_, b) in zip(*[e.model.named_parameters() for e in engines]):  # the step's gradients
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-7), name
    no_signal = [i for i in range(len(batch)) if not (batch.extras["advantages"][i] * batch.response_mask[i]).any()]
    assert len(no_signal) == len(batch) - len(kept)
    zero = batch.select(no_signal)  # no signal at all: one row still runs, so the optimizer steps as before
    assert len(rows_with_gradient(zero)) == 1
