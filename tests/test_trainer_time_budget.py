"""``trainer.total_time_s`` was checked only once a batch was fetched, so a run whose batch never fills (DAPO's
filter_groups dropping every group with ``max_num_gen_batches=0``, or a stalled rollout) ran past it for ever. The fetch
now waits no longer than the budget left plus a grace (``time_budget_grace``: twice the longest step, at least 30 s,
so a batch due at the budget's end still trains; the tests shorten it), and the run ends as a normal one, with a
reason. Also the driver's Ctrl-C
(``FullyAsyncTrainer.request_stop``). Fakes for the trainer's Ray peers (``tests/fake_queue.py``), no Ray."""

import asyncio
import time

import pytest

from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer
from fake_queue import FakeMessageQueue, FakeRollouter, fake_samples
from test_fit_step import _cfg


class _EqualGroupsAfterOneGood(FakeMessageQueue):
    """One group with reward variance, then for ever groups whose every response scored 0 (a reward that never
    matches the data's ground truth)."""

    def __init__(self, n: int):
        super().__init__([])
        self.n, self.served = n, 0

    async def get_samples_async(self, k: int, timeout=None):
        await asyncio.sleep(0.001)
        rewards = [[0.0] * self.n for _ in range(k)]
        if self.served == 0:
            rewards[0] = [0.0, 1.0] * (self.n // 2)
        self.served += k
        return fake_samples(k, self.n, rewards=rewards, seed=self.served)


class _SilentQueue(FakeMessageQueue):
    """Delivers nothing: waits ``timeout`` (as the real queue) or until :meth:`close`, then ``None``."""

    def __init__(self):
        super().__init__([])
        self.closed = asyncio.Event()
        self.timeouts: list = []

    async def get_samples_async(self, k: int, timeout=None):
        self.timeouts.append(timeout)
        try:
            await asyncio.wait_for(self.closed.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return None


def _trainer(random_model_dir, queue, total_time_s):
    cfg = _cfg("dapo", random_model_dir, **{"algorithm.filter_groups.max_num_gen_batches": 0,
                                            "trainer.total_training_steps": 100, "trainer.total_time_s": total_time_s,
                                            "trainer.watchdog_timeout_s": 0})
    trainer = FullyAsyncTrainer(cfg, queue, FakeRollouter(), {})
    trainer.time_budget_grace = lambda: 0.5
    return trainer


@pytest.mark.timeout(120, method="thread")
def test_the_time_budget_ends_a_run_whose_groups_are_all_filtered(random_model_dir):
    trainer = _trainer(random_model_dir, None, 1.5)
    trainer.mq = _EqualGroupsAfterOneGood(trainer.cfg.actor_rollout_ref.rollout.n)
    trainer.t_start = time.time()
    status = asyncio.run(trainer.fit())
    assert time.time() - trainer.t_start < 10
    assert status["done"] and trainer.global_steps == 0 and trainer.dropped["dapo_no_signal"] > 0
    n = trainer.dropped["dapo_no_signal"]
    assert trainer.stop_reason == ("time budget trainer.total_time_s=1.5 spent while waiting for the batch of step 1 "
                                   f"(step 0/100 done); algorithm.filter_groups dropped {n} prompt groups without "
                                   f"reward variance ({n} all scoring 0: 0 = too hard or a reward that never matches "
                                   "the ground truth, 1 = too easy)")
    assert trainer.rollouter.admission_closed  # nothing started now could train
    assert trainer.ledger.counts()["dropped/fetched_at_time_budget"] == 1  # the one good group, fetched, never trained
    assert trainer.filtered_scores == {0.0: trainer.dropped["dapo_no_signal"]}  # what the watchdog names


@pytest.mark.timeout(60, method="thread")
def test_a_fetch_waits_no_longer_than_the_time_budget_left(random_model_dir):
    queue = _SilentQueue()
    trainer = _trainer(random_model_dir, queue, 1.0)
    trainer.t_start = time.time()
    asyncio.run(trainer.fit())
    assert 0 < queue.timeouts[0] <= 1.5 and time.time() - trainer.t_start < 5
    assert trainer.stop_reason.startswith("time budget trainer.total_time_s=1 spent while waiting for the batch of "
                                          "step 1"), trainer.stop_reason


@pytest.mark.timeout(60, method="thread")
def test_request_stop_ends_the_run_with_its_reason(random_model_dir):
    """The driver's Ctrl-C: ``request_stop`` then the queue's shutdown wakes the waiting fetch."""
    queue = _SilentQueue()
    trainer = _trainer(random_model_dir, queue, 0)

    async def scenario():
        fit = asyncio.create_task(trainer.fit())
        await asyncio.sleep(0.2)
        trainer.request_stop("interrupted by the user (Ctrl-C)")
        queue.closed.set()
        return await fit

    status = asyncio.run(scenario())
    assert queue.timeouts == [None]  # no time budget: the fetch waits without a timeout
    assert status["done"] and status["stop_reason"] == "interrupted by the user (Ctrl-C) at step 0"


@pytest.mark.timeout(60, method="thread")
def test_a_batch_queued_when_the_budget_runs_out_is_still_trained(random_model_dir):
    """A colocated round generated within the budget is in the queue when its fetch starts late: that fetch takes
    what is queued and the step trains (the last), as a batch fetched after the budget always did."""
    cfg = _cfg("grpo", random_model_dir, **{"trainer.total_training_steps": 100, "trainer.total_time_s": 1.0,
                                            "trainer.watchdog_timeout_s": 0})
    trainer = FullyAsyncTrainer(cfg, FakeMessageQueue(fake_samples(4, cfg.actor_rollout_ref.rollout.n)),
                                FakeRollouter(), {})
    trainer.t_start = time.time() - 2.0
    asyncio.run(trainer.fit())
    assert trainer.global_steps == 1 and trainer.trained == 4, trainer.stop_reason
    assert trainer.stop_reason == "time budget trainer.total_time_s=1 reached at step 1/100"


class _LateQueue(FakeMessageQueue):
    """The batch arrives ``delay`` s after the fetch starts (a step whose generation ends just after the budget)."""

    def __init__(self, samples, delay: float):
        super().__init__(samples)
        self.delay = delay

    async def get_samples_async(self, k: int, timeout=None):
        if timeout is not None and timeout < self.delay:
            await asyncio.sleep(timeout)
            return None
        await asyncio.sleep(self.delay)
        return await super().get_samples_async(k, timeout)


@pytest.mark.timeout(60, method="thread")
def test_a_batch_due_just_after_the_budget_still_trains_as_the_last_step(random_model_dir):
    """The first version of this change stopped a fetch at the budget: a batch 1 s from done was dropped
    (``fetched_at_time_budget``) and a time-budget stop left up to twice the samples of a step-count stop at
    shutdown (tests/test_e2e.py). Within the grace it trains, as the last step."""
    cfg = _cfg("grpo", random_model_dir, **{"trainer.total_training_steps": 100, "trainer.total_time_s": 1.0,
                                            "trainer.watchdog_timeout_s": 0})
    trainer = FullyAsyncTrainer(cfg, _LateQueue(fake_samples(4, cfg.actor_rollout_ref.rollout.n), 1.5),
                                FakeRollouter(), {})
    assert trainer.time_budget_grace() == 30.0  # no step yet: the floor
    trainer.time_budget_grace = lambda: 2.0
    trainer.t_start = time.time()
    asyncio.run(trainer.fit())
    assert trainer.global_steps == 1 and trainer.trained == 4, trainer.stop_reason
    assert trainer.stop_reason == "time budget trainer.total_time_s=1 reached at step 1/100"
