"""staleness/update_lag_*: lag of trained tokens in optimizer updates, next to the lag in syncs (versions).

In-process FullyAsyncTrainer with the fakes of tests/fake_queue.py and a tiny random Qwen2 (no syncs:
there are no replicas), so every trained token comes from version 0 while the updates pile up: exactly
what mode b's sync window looks like from the trainer's side.
"""

import asyncio

from asyncrl.recipes import smoke_cpu
from fake_queue import FakeMessageQueue, FakeRollouter, fake_samples


def test_update_lag_grows_with_the_updates_a_version_has_not_seen(random_model_dir):
    from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer

    cfg = smoke_cpu("a")
    cfg.actor_rollout_ref.model.path = str(random_model_dir)
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 2
    cfg.async_training.require_batches = 2  # 2 updates per step
    cfg.async_training.trigger_parameter_sync_step = 1000  # no weight sync: version 0 throughout
    cfg.trainer.total_training_steps = 3
    trainer = FullyAsyncTrainer(cfg, FakeMessageQueue(fake_samples(12, cfg.actor_rollout_ref.rollout.n)),
                                FakeRollouter(), {})
    for _ in range(3):
        assert asyncio.run(trainer.fit_step())
    rows = trainer.history
    assert [r["staleness/lag_max"] for r in rows] == [0, 0, 0]  # no sync: lag 0 in versions
    # step s trains version-0 tokens with 2 (s - 1) updates done; its 2nd mini-batch is one more behind
    assert [r["staleness/update_lag_mean"] for r in rows] == [0.5, 2.5, 4.5]
    assert [r["staleness/update_lag_max"] for r in rows] == [1, 3, 5]
    assert trainer.updates == 6 and trainer.updates_at_version == {0: 0}


def test_update_lag_counters_continue_across_a_checkpoint(random_model_dir):
    """Issue 12: the update-lag bookkeeping is in the checkpoint. A trainer restored from step 2 (between
    syncs) reports at step 3 what the uninterrupted trainer reports, not a lag restarted at zero updates."""
    import json

    from asyncrl.checkpoint.trainer_state import restore_counters, trainer_state
    from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer

    cfg = smoke_cpu("a")
    cfg.actor_rollout_ref.model.path = str(random_model_dir)
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 2
    cfg.async_training.require_batches = 2
    cfg.async_training.trigger_parameter_sync_step = 1000
    cfg.async_training.staleness_threshold = 1.0  # B trains the version-0 tokens one version behind
    n = cfg.actor_rollout_ref.rollout.n
    a = FullyAsyncTrainer(cfg, FakeMessageQueue(fake_samples(8, n)), FakeRollouter(), {})
    for _ in range(2):
        assert asyncio.run(a.fit_step())
    state = json.loads(json.dumps(trainer_state(a)))  # as trainer_state.json holds it
    b = FullyAsyncTrainer(cfg, FakeMessageQueue(fake_samples(4, n, seed=1)), FakeRollouter(), {})
    restore_counters(b, state)
    # not synced at step 2: the restored weights are served as version 1, with the 4 updates baked in
    assert (b.global_steps, b.param_version, b.updates) == (2, 1, 4) and b.updates_at_version == {0: 0, 1: 4}
    assert asyncio.run(b.fit_step())
    row = b.history[-1]
    assert row["step"] == 3 and b.updates == 6
    # the step-3 tokens are version 0 (the fake queue's), trained 4 and 5 updates later: as without the stop
    assert (row["staleness/update_lag_mean"], row["staleness/update_lag_max"]) == (4.5, 5)


def test_the_rows_by_length_counters_continue_across_a_checkpoint(random_model_dir):
    """Session 21, a fresh user's pass: a run resumed from a checkpoint summarised its groups dropped as stale with
    the lengths counted since the resume only (``stale_length_counts`` empty, the accounting's count whole). The
    trainer's three rows-by-length counters are in the checkpoint now and continue as the lag counts do."""
    import collections
    import json

    from asyncrl.checkpoint.trainer_state import LENGTH_COUNTERS, restore_counters, trainer_state
    from asyncrl.staleness import sample_budget
    from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer

    cfg = smoke_cpu("a")
    cfg.actor_rollout_ref.model.path = str(random_model_dir)
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 2
    cfg.async_training.trigger_parameter_sync_step = 1000  # no sync (the fake rollouter has none)
    cfg.async_training.staleness_threshold = 1.0  # the restored trainer (version 1) trains the version-0 tokens
    n = cfg.actor_rollout_ref.rollout.n
    rows = sample_budget(cfg).required_samples * n  # one step's
    a = FullyAsyncTrainer(cfg, FakeMessageQueue(fake_samples(4, n)), FakeRollouter(), {})
    assert asyncio.run(a.fit_step())
    a.stale_length_counts.update({300: 8})  # as _fetch_batch counts a group of 8 dropped stale
    state = json.loads(json.dumps(trainer_state(a)))  # as trainer_state.json holds it (string keys)
    b = FullyAsyncTrainer(cfg, FakeMessageQueue(fake_samples(4, n, seed=1)), FakeRollouter(), {})
    restore_counters(b, state)
    assert sum(b.response_length_counts.values()) == rows and b.stale_length_counts == {300: 8}
    assert all(isinstance(k, int) for name in LENGTH_COUNTERS for k in getattr(b, name))
    before = collections.Counter(b.response_length_counts)
    assert asyncio.run(b.fit_step())
    assert sum(b.response_length_counts.values()) == sum(before.values()) + rows  # counting on from the checkpoint
    del state["stale_length_counts"]  # a checkpoint from before session 21: the counter restarts empty
    c = FullyAsyncTrainer(cfg, FakeMessageQueue(fake_samples(4, n, seed=2)), FakeRollouter(), {})
    restore_counters(c, state)
    assert c.stale_length_counts == {}
