"""Exact resume on the real stack (Ray + transformers replicas + torch trainer), issue 12 item 2.

Run A trains to the end with checkpoints; run B resumes from A's mid-run checkpoint in the same run
directory. Checked exactly: B's first step is N + 1, the LR schedule continues (B's ``actor/lr`` at
every step equals A's), B's first prompt is the one after the checkpoint's data position and every
prompt B trains is the row the (seed, epoch) order puts at its seq, ``metrics.csv`` holds steps
1..end once, and the accounting balances over both runs (in-flight prompts at the checkpoint are
dropped and counted). For trigger_parameter_sync_step 1 and 4 (a checkpoint between syncs makes
its weights a new version).
"""

from __future__ import annotations

import pytest

from asyncrl.data.sampler import ResumableSampler
from asyncrl.experiment import Experiment
from asyncrl.recipes import smoke_cpu
from asyncrl.tracking import read_metrics_csv

pytestmark = [pytest.mark.e2e]


def tiny_cfg(tmp_path, trigger, steps, save_freq, **kw):
    cfg = smoke_cpu("a" if trigger == 1 else "b")
    cfg.trainer.experiment_name = f"resume_t{trigger}"
    cfg.trainer.default_local_dir = str(tmp_path)
    cfg.trainer.progress_bar = False
    cfg.trainer.total_training_steps = steps
    cfg.trainer.save_freq = save_freq
    cfg.trainer.test_freq = 0
    cfg.trainer.logger = kw.pop("logger", [])
    cfg.trainer.wandb_mode = "offline"
    cfg.async_training.trigger_parameter_sync_step = trigger
    cfg.async_training.require_batches = 1
    cfg.actor_rollout_ref.rollout.name = "hf"
    cfg.actor_rollout_ref.rollout.n = 2
    cfg.actor_rollout_ref.rollout.response_length = 8
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 4
    cfg.actor_rollout_ref.actor.optim.lr_warmup_steps = 3
    cfg.data.train_size = 64
    cfg.data.val_size = 4
    for k, v in kw.items():
        setattr(cfg.trainer, k, v)
    return cfg


def run(cfg):
    import ray

    exp = Experiment(cfg)
    try:
        exp.start()
        summary = exp.wait(progress=False)
        trained = ray.get(exp.trainer.trained_samples.remote())
        status = ray.get(exp.trainer.status.remote())  # the update-lag counters
    finally:
        exp.stop()
    return exp, summary, trained, status


@pytest.mark.parametrize("trigger,steps,ckpt", [(1, 6, 3), (4, 8, 2)])
def test_resume_continues_steps_data_and_lr_exactly(ray_session, tmp_path, monkeypatch, trigger, steps, ckpt):
    monkeypatch.setenv("WANDB_SILENT", "true")
    loggers = ["console", "tensorboard", "wandb"] if trigger == 1 else []
    exp_a, sum_a, trained_a, st_a = run(tiny_cfg(tmp_path, trigger, steps, save_freq=ckpt, logger=loggers))
    run_dir = exp_a.run_dir
    rows_a = read_metrics_csv(run_dir / "metrics.csv")
    assert [r["step"] for r in rows_a] == list(range(1, steps + 1))
    ck = run_dir / "checkpoints" / f"global_step_{ckpt}"
    assert (ck / "actor" / "huggingface" / "model.safetensors").exists() and (ck / "meta.json").exists()
    from asyncrl.checkpoint.fingerprint import model_fingerprint  # what auto-resume knows a moved model folder by
    from asyncrl.checkpoint.manager import read_json

    fingerprint = model_fingerprint(exp_a.config.actor_rollout_ref.model.path)
    assert fingerprint is not None and read_json(ck / "meta.json")["model_fingerprint"] == fingerprint
    assert sum_a.last_checkpoint.endswith(f"global_step_{steps}")
    if loggers:
        assert list((run_dir / "tensorboard").glob("events.*")) and list((run_dir / "wandb").glob("offline-run-*"))

    ro_state = read_json(ck / "rollouter_state.json")
    cfg_b = tiny_cfg(tmp_path, trigger, steps, save_freq=ckpt, resume_mode="resume_path", resume_from_path=str(ck))
    exp_b, sum_b, trained_b, st_b = run(cfg_b)
    assert exp_b.run_dir == run_dir and sum_b.resumed_from == str(ck)
    rows_b = read_metrics_csv(run_dir / "metrics.csv")
    print(f"\ntrigger={trigger}: checkpoint at step {ckpt} (taken {ro_state['taken']}, position {ro_state['position']});"
          f" resumed steps {[r['step'] for r in rows_b[ckpt:]]}, first seq trained {min(s for _, s, _ in trained_b)}")
    # step labels: 1..ckpt from A, then ckpt+1.. from B, each once
    assert [r["step"] for r in rows_b] == list(range(1, steps + 1)) and sum_b.steps == steps
    assert min(step for step, _, _ in trained_b) == ckpt + 1
    # learning rate: B's schedule continues A's exactly
    assert [r["actor/lr"] for r in rows_b] == [r["actor/lr"] for r in rows_a]
    # data position: B takes seqs from the checkpoint's `taken` on, each the row the order gives it
    order = ResumableSampler(cfg_b.data.train_size, cfg_b.trainer.seed)
    expected = [order.advance() for _ in range(max(s for _, s, _ in trained_b) + 1)]
    assert min(s for _, s, _ in trained_b) >= ro_state["taken"]
    assert all(expected[seq] == index for _, seq, index in trained_a + trained_b)
    # versions: the same as A's at every resumed step, one more after a checkpoint between syncs
    # (trigger 4, step 2: its weights become a new version when they reach the replicas)
    shift = 0 if ckpt % trigger == 0 else 1
    assert [r["param_version"] for r in rows_b[ckpt:]] == [r["param_version"] + shift for r in rows_a[ckpt:]]
    # update-lag counters continue (not restart at zero): B ends with A's actor updates; the updates baked
    # into each version up to the checkpoint's are A's, and the later versions (shifted) carry A's counts
    upd_a, upd_b = st_a["updates_at_version"], st_b["updates_at_version"]
    v_ckpt = read_json(ck / "trainer_state.json")["param_version"]
    assert st_b["updates"] == st_a["updates"] == steps
    assert {v: n for v, n in upd_b.items() if v <= v_ckpt} == {v: n for v, n in upd_a.items() if v <= v_ckpt}
    assert all(upd_b[v + shift] == n for v, n in upd_a.items() if v > v_ckpt), (upd_a, upd_b)
    if shift:  # the checkpoint's weights, served as a new version, hold the updates done at the checkpoint
        assert upd_b[v_ckpt + 1] == ckpt
    # accounting over both runs: balanced, the checkpoint's in-flight prompts dropped and counted
    acc = sum_b.accounting
    assert acc["balanced"] and acc["lost"] == 0 and acc["accounted_twice"] == 0, acc
    assert acc["trained"] == steps * 4
    in_flight = read_json(ck / "ledger.json")["in_flight"]
    assert acc["dropped"].get("in_flight_at_checkpoint", 0) == len(in_flight)
    # the resumed curve continues (same level of reward within the noise of 8-response batches)
    mean = lambda rows: sum(r["reward/mean"] for r in rows) / len(rows)  # noqa: E731
    assert abs(mean(rows_b[ckpt:]) - mean(rows_a[ckpt:])) < 0.4
