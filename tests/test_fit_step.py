"""FullyAsyncTrainer.fit_step in-process for every algorithm family, on synthetic prompt groups.

The trainer's Ray peers are fakes (``tests/fake_queue.py``); the model is a tiny random Qwen2. What
is checked is the wiring of each family through fit_step (which tensors exist, which metrics are
logged, DAPO's drops counted where the accounting reads them); the maths has its own tests and the
real stack its end-to-end runs.
"""

import asyncio
import logging
import math
import re

import pytest

from asyncrl.recipes import smoke_cpu
from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer
from fake_queue import FakeMessageQueue, FakeRollouter, fake_samples


def _trainer(cfg, samples):
    from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer

    return FullyAsyncTrainer(cfg, FakeMessageQueue(samples), FakeRollouter(), {})


def _cfg(family, model_dir, **changes):
    cfg = smoke_cpu("a", family)
    cfg.actor_rollout_ref.model.path = str(model_dir)
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 2
    cfg.async_training.require_batches = 2
    cfg.async_training.trigger_parameter_sync_step = 1000  # no weight sync (no replicas here)
    cfg.trainer.total_training_steps = 2
    for k, v in changes.items():
        obj = cfg
        *parents, leaf = k.split(".")
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, leaf, v)
    return cfg


@pytest.mark.parametrize("family,changes,expect", [
    ("grpo", {}, ["actor/pg_loss", "actor/pg_clipfrac_lower"]),
    ("dr_grpo", {}, ["actor/pg_loss"]),
    ("rloo", {"actor_rollout_ref.actor.entropy_coeff": 0.01}, ["actor/entropy"]),
    ("reinforce_plus_plus", {}, ["actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"]),
    ("grpo", {"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_type": "k2"},
     ["actor/kl_loss"]),
    ("ppo_gae", {}, ["critic/vf_loss", "critic/grad_norm", "critic/returns_mean"]),
    ("grpo", {"algorithm.rollout_correction.bypass_mode": False, "algorithm.rollout_correction.rollout_is": "sequence",
              "algorithm.rollout_correction.rollout_rs": "token", "actor_rollout_ref.rollout.top_p": 0.8},
     ["rollout_corr/kl_k3", "rollout_corr/is_weight_mean", "rollout_corr/rs_rejected_frac"]),
])
def test_fit_step_runs_each_family(random_model_dir, family, changes, expect):
    cfg = _cfg(family, random_model_dir, **changes)
    trainer = _trainer(cfg, fake_samples(8, cfg.actor_rollout_ref.rollout.n))
    assert asyncio.run(trainer.fit_step())
    assert not trainer.rollouter.admission_closed  # one more step to come: the rollouter keeps admitting
    assert asyncio.run(trainer.fit_step())
    assert trainer.rollouter.admission_closed  # the last batch is fetched: nothing started now could train
    row = trainer.history[-1]
    for key in expect:
        assert key in row and math.isfinite(row[key]), (key, row.get(key))
    assert all(math.isfinite(v) for k, v in row.items() if isinstance(v, float)), row
    assert trainer.trained == 8


def test_the_run_dirs_metrics_csv_has_its_header_before_the_first_step(random_model_dir, tmp_path):
    """metrics.csv had no header until a step completed (a run stopped before it had an empty file): the trainer opens
    it with the step columns, which are the first keys of every row it logs."""
    import pandas as pd

    from asyncrl.tracking import STEP_COLUMNS

    cfg = _cfg("grpo", random_model_dir, **{"trainer.total_training_steps": 1})
    trainer = FullyAsyncTrainer(cfg, FakeMessageQueue(fake_samples(4, cfg.actor_rollout_ref.rollout.n)),
                                FakeRollouter(), {}, run_dir=str(tmp_path))
    assert list(pd.read_csv(tmp_path / "metrics.csv").columns) == list(STEP_COLUMNS)
    assert asyncio.run(trainer.fit_step())
    assert tuple(trainer.history[-1])[:len(STEP_COLUMNS)] == STEP_COLUMNS
    assert tuple(pd.read_csv(tmp_path / "metrics.csv").columns)[:len(STEP_COLUMNS)] == STEP_COLUMNS
    trainer.close()


def test_dapo_drops_equal_groups_counts_them_and_fetches_more(random_model_dir):
    cfg = _cfg("dapo", random_model_dir, **{"trainer.total_training_steps": 1})
    n = cfg.actor_rollout_ref.rollout.n
    rewards = [[1.0] * n, [0.0, 1.0] + [0.0] * (n - 2), [0.0] * n, [1.0, 0.0] + [1.0] * (n - 2),
               [0.0, 0.0, 1.0] + [0.0] * (n - 3), [1.0] * n, [0.0, 1.0] * (n // 2)]
    samples = fake_samples(len(rewards), n, rewards=rewards)
    trainer = _trainer(cfg, samples)
    assert asyncio.run(trainer.fit_step())
    # 4 groups needed: fetch 4 (0 and 2 all-equal, dropped), fetch 2 more (5 dropped), fetch 1 more
    assert trainer.trained == 4 and trainer.dropped["dapo_no_signal"] == 3
    assert trainer.mq.actor.drops == {"dapo_no_signal": 3} and trainer.rollouter.released == 3
    assert trainer.history[-1]["trainer/dropped_dapo_no_signal"] == 3 and not trainer.mq.samples
    assert trainer.history[-1]["critic/advantages_abs_mean"] > 0


def test_dapo_gives_up_after_max_num_gen_batches(random_model_dir):
    cfg = _cfg("dapo", random_model_dir, **{"algorithm.filter_groups.max_num_gen_batches": 1})
    n = cfg.actor_rollout_ref.rollout.n
    trainer = _trainer(cfg, fake_samples(12, n, rewards=[[1.0] * n] * 12))
    with pytest.raises(RuntimeError, match="max_num_gen_batches"):
        asyncio.run(trainer.fit_step())


class _EndlessEqualGroups(FakeMessageQueue):
    """A queue that never runs out, and whose every prompt group scored the same for each response."""

    def __init__(self, n: int):
        super().__init__([])
        self.n, self.served = n, 0

    async def get_samples_async(self, k: int, timeout=None):
        await asyncio.sleep(0)
        self.served += k
        return fake_samples(k, self.n, rewards=[[1.0] * self.n] * k, seed=self.served)


@pytest.mark.timeout(120, method="thread")
def test_dapo_without_a_limit_keeps_fetching_as_verl_and_warns_once_a_minute_naming_the_key(random_model_dir, caplog):
    """``filter_groups.enable=true`` with ``max_num_gen_batches=0`` (verl: unlimited) on data whose every group scores
    the same fetched for ever without a word (the watchdog, when on, blamed generation). As verl, it keeps fetching,
    and warns naming the key and the way out: at the first batch's worth dropped, then at most once a minute with
    the count since (one warning per batch's worth wrote 214 lines in 4 minutes and buried the watchdog)."""
    cfg = _cfg("dapo", random_model_dir, **{"algorithm.filter_groups.max_num_gen_batches": 0})
    n = cfg.actor_rollout_ref.rollout.n
    trainer = FullyAsyncTrainer(cfg, _EndlessEqualGroups(n), FakeRollouter(), {})
    need = cfg.actor_rollout_ref.actor.ppo_mini_batch_size * cfg.async_training.require_batches

    async def step_until_dropped(more_batches, task=None):
        task = task or asyncio.create_task(trainer.fit_step())
        until = trainer.dropped["dapo_no_signal"] + more_batches * need
        while trainer.dropped["dapo_no_signal"] < until:
            await asyncio.sleep(0.01)
        assert not task.done()  # still fetching: 0 = unlimited, as verl
        return task

    async def scenario():
        task = await step_until_dropped(3)
        warned_before = len(_warnings(caplog))
        trainer._filter_warning.last_t -= 61  # a minute later
        await step_until_dropped(2, task)
        task.cancel()
        return warned_before

    with caplog.at_level(logging.WARNING, logger="asyncrl.trainer.fully_async_trainer"):
        warned_before = asyncio.run(scenario())
    warned = _warnings(caplog)
    assert warned_before == 1, warned  # 3 batches' worth in well under a minute: one line
    assert ("algorithm.filter_groups dropped 4 prompt groups without reward variance in this step (1 batches' worth of "
            "4) and kept 0") in warned[0], warned[0]
    assert "algorithm.filter_groups.max_num_gen_batches=0 keeps fetching" in warned[0], warned[0]
    assert len(warned) == 2, warned
    m = re.search(r"in this step \((\d+) batches' worth of 4\).*; (\d+) dropped since the last such warning 6\d s ago",
                  warned[1])
    assert m and int(m[1]) >= 4 and int(m[2]) == 4 * (int(m[1]) - 1), warned[1]  # all but the first warning's batch


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "filter_groups" in r.getMessage()]


def test_a_sample_the_trainer_cannot_unpickle_is_accounted_as_failed_and_replaced(random_model_dir):
    """The queue's client hands back an UnreadableSample (asyncrl.message_queue) for a queued sample that could not be
    unpickled here: the trainer records it failed/unpicklable (fetched first, so it is not also 'unconsumed') and
    fetches another in its place; the step trains a full batch."""
    from asyncrl.message_queue import UnreadableSample

    cfg = _cfg("grpo", random_model_dir)
    samples = fake_samples(9, cfg.actor_rollout_ref.rollout.n)
    bad = samples[1].seq
    samples[1] = UnreadableSample(bad, "RuntimeError: cannot load")
    trainer = _trainer(cfg, samples)
    assert asyncio.run(trainer.fit_step())
    assert trainer.trained == 4 and trainer.mq.samples  # 4 trained of the 5 taken, the rest still queued
    assert trainer.ledger.counts()["failed/unpicklable"] == 1 and trainer.ledger.counts()["fetched"] == 5
    assert list(trainer.ledger.seqs("failed/unpicklable")) == [bad]
