"""FullyAsyncRollouter staleness accounting: pause at max_required_samples, reset_staleness, resume.

The rollouter runs in-process with test fakes for the replica, load balancer and queue (named as
fakes); the real stack is covered by test_e2e.py.
"""

import asyncio

import pytest

from asyncrl.data.dataset import get_task_rows
from asyncrl.recipes import smoke_cpu
from asyncrl.rollout.base import TokenOutput
from asyncrl.rollouter import FullyAsyncRollouter
from asyncrl.staleness import sample_budget


class FakeGatedReplica:
    """Generates a fixed short answer; blocks while ``gate`` is cleared. Has Ray-like ``.remote`` hooks."""

    def __init__(self):
        self.gate = asyncio.Event()
        self.gate.set()
        self.paused_modes = []

        class _M:
            def __init__(self, fn):
                self.remote = fn
        self.pause = _M(self._pause)
        self.resume = _M(self._resume)

    async def _pause(self, mode="abort"):
        self.paused_modes.append(mode)

    async def _resume(self):
        self.paused_modes.append("resume")

    async def generate(self, request_id, prompt_ids, sp):
        await self.gate.wait()
        return TokenOutput([52, 258], [-0.1, -0.2], "completed", response_versions=[0, 0])


class FakePool:
    def __init__(self, replica):
        self.replica = replica

    async def acquire_server_async(self, request_id):
        return "r0", self.replica

    async def release_server_async(self, sid, request_id):
        pass


class FakeQueue:
    """In-process stand-in for the MessageQueue client (stores the samples)."""

    def __init__(self):
        self.items = []

    async def put_payload_async(self, sample):
        self.items.append(sample)
        return True

    async def size_async(self):
        return len(self.items)


async def _settle(ro, cond, timeout=10.0):
    t0 = asyncio.get_running_loop().time()
    while not cond():
        if asyncio.get_running_loop().time() - t0 > timeout:
            raise AssertionError(f"condition not reached; snapshot={await ro.snapshot()}")
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # and nothing more happens after it


def _make(staleness=0.5, partial=True):
    cfg = smoke_cpu("d")
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 1
    cfg.async_training.require_batches = 2
    cfg.async_training.staleness_threshold = staleness
    cfg.async_training.partial_rollout = partial
    cfg.actor_rollout_ref.rollout.n = 2
    cfg.actor_rollout_ref.rollout.agent.num_workers = 0
    cfg.trainer.test_freq = 0
    rows = get_task_rows("arith", "train", 50, 0)
    replica, q = FakeGatedReplica(), FakeQueue()
    ro = FullyAsyncRollouter(cfg, rows, rows[:4], {"r0": replica}, FakePool(replica), q)
    return cfg, ro, replica, q


def test_pauses_at_max_required_and_resets(ray_session):
    async def main():
        cfg, ro, replica, q = _make()
        b = sample_budget(cfg)
        assert (b.required_samples, b.max_required_samples) == (2, 3)
        await ro.start()
        await _settle(ro, lambda: len(q.items) == 3)
        assert ro.staleness_samples == 3 and len(q.items) == 3  # paused: budget spent, nothing more starts
        assert len(ro.active_tasks) == 0
        # the trainer consumes one window (2 samples) and syncs
        q.items = q.items[2:]
        await ro.pause_for_sync()
        assert replica.paused_modes == ["abort"]  # partial rollout: in-flight requests are aborted
        await ro.resume_after_sync(1)
        # reset_staleness = active (0) + queued (1) -> 2 more samples may start
        await _settle(ro, lambda: len(q.items) == 3)
        assert ro.staleness_samples == 3 and ro.param_version == 1
        acc = (await ro.stop())
        assert acc["taken"] == acc["enqueued"] + acc["pending"] + sum(acc["dropped"].values()) + sum(acc["failed"].values())
        assert acc["enqueued"] == 5
    asyncio.run(main())


def test_reset_staleness_counts_active_tasks(ray_session):
    async def main():
        cfg, ro, replica, q = _make(staleness=1.0)  # max_required = 4
        replica.gate.clear()  # generation hangs: samples stay active
        await ro.start()
        await _settle(ro, lambda: len(ro.active_tasks) == 4)
        assert ro.staleness_samples == 4 and len(q.items) == 0
        assert await ro.reset_staleness() == 4  # 4 active + 0 queued
        replica.gate.set()
        await _settle(ro, lambda: len(q.items) == 4)
        assert await ro.reset_staleness() == 4  # 0 active + 4 queued: still no room
        await asyncio.sleep(0.3)
        assert len(q.items) == 4
        q.items.clear()
        assert await ro.reset_staleness() == 0
        await _settle(ro, lambda: len(q.items) == 4)
        await ro.stop()
    asyncio.run(main())


def test_no_partial_rollout_sync_waits_for_active(ray_session):
    async def main():
        cfg, ro, replica, q = _make(partial=False)
        replica.gate.clear()
        await ro.start()
        await _settle(ro, lambda: len(ro.active_tasks) == 3)
        pause = asyncio.create_task(ro.pause_for_sync())
        await asyncio.sleep(0.3)
        assert not pause.done()  # waits for in-flight samples to finish
        replica.gate.set()
        await asyncio.wait_for(pause, 10)
        assert len(ro.active_tasks) == 0 and len(q.items) == 3 and replica.paused_modes == []
        await ro.stop()
    asyncio.run(main())


class FakeCancellingReplica(FakeGatedReplica):
    """Requests wait on ``gate``; the first request instead waits on ``cancel`` and then raises
    ``asyncio.CancelledError`` itself, as an engine whose request was cancelled under it."""

    def __init__(self):
        super().__init__()
        self.gate.clear()
        self.cancel = asyncio.Event()
        self.seen: list = []

    async def generate(self, request_id, prompt_ids, sp):
        self.seen.append(request_id)
        if len(self.seen) == 1:
            await self.cancel.wait()
            raise asyncio.CancelledError()
        return await super().generate(request_id, prompt_ids, sp)


def test_a_callees_cancellation_fails_the_sample_and_rollout_continues(ray_session):
    """Issue 13.4: mini-batch 2, require_batches 1, staleness 0, n 2, two samples in flight; after a sync
    one engine request raises CancelledError. It used to count as ``aborted_at_shutdown``, keep its
    staleness slot and stop rollout for good (queue 1 of 2, budget full, nothing in flight)."""
    async def main():
        cfg = smoke_cpu("d")
        cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 2
        cfg.async_training.require_batches = 1
        cfg.async_training.staleness_threshold = 0.0
        cfg.actor_rollout_ref.rollout.n = 2
        cfg.actor_rollout_ref.rollout.agent.num_workers = 0
        cfg.trainer.test_freq = 0
        rows = get_task_rows("arith", "train", 50, 0)
        replica, q = FakeCancellingReplica(), FakeQueue()
        ro = FullyAsyncRollouter(cfg, rows, rows[:4], {"r0": replica}, FakePool(replica), q)
        assert sample_budget(cfg).max_required_samples == 2
        await ro.start()
        await _settle(ro, lambda: len(replica.seen) == 4)  # two samples x n=2 requests, all waiting
        await ro.pause_for_sync()
        await ro.resume_after_sync(1)
        victim = replica.seen[0]
        replica.cancel.set()  # the engine request raises CancelledError
        await _settle(ro, lambda: sum(ro.failed.values()) == 1 and len(ro.active_tasks) == 2)
        assert dict(ro.failed) == {"TrajectoryCancelled": 1} and "aborted_at_shutdown" not in ro.dropped
        rec, = ro.failures.snapshot()
        assert rec["uid"] and victim.startswith(rec["uid"]) and rec["type"] == "TrajectoryCancelled"
        assert rec["trajectories"] == {"failed": 1, "cancelled": 1, "completed": 0}  # the sibling was cancelled
        assert ro.agent_loops.workers[0].cancelled_trajectories == 1
        replica.gate.set()  # the slot came back: a third sample started; rollout fills the queue
        await _settle(ro, lambda: len(q.items) == 2)
        acc = await ro.stop()
        assert acc["taken"] == acc["enqueued"] + acc["pending"] + sum(acc["dropped"].values()) + sum(acc["failed"].values())
        assert acc["enqueued"] == 2 and acc["failed"] == {"TrajectoryCancelled": 1}
    asyncio.run(main())


def test_stop_is_the_only_shutdown_cancellation(ray_session):
    async def main():
        cfg, ro, replica, q = _make(staleness=0.0)
        replica.gate.clear()
        await ro.start()
        await _settle(ro, lambda: len(ro.active_tasks) == 2)
        acc = await ro.stop()
        assert acc["dropped"].get("aborted_at_shutdown") == 2 and acc["failed"] == {}
        assert acc["taken"] == acc["pending"] + sum(acc["dropped"].values())
    asyncio.run(main())


class FakeFullQueue(FakeQueue):
    """A queue that is full: each put waits (as the MessageQueue actor's does) and, like the actor call,
    completes on its own even when the caller stops waiting (a Ray actor call is not cancelled with the
    awaiting coroutine); the queue then accounts for the sample itself."""

    def __init__(self):
        super().__init__()
        self.space = asyncio.Event()
        self.pending = []

    async def put_payload_async(self, ref):
        task = asyncio.ensure_future(self._put(ref))  # the remote call, independent of the caller
        self.pending.append(task)
        return await asyncio.shield(task)

    async def _put(self, ref):
        await self.space.wait()
        self.items.append(ref)
        return True


def test_cancelled_while_the_queue_is_full_is_counted_once(ray_session):
    """Invariant 1 at shutdown: a sample whose put was waiting on a full queue is the queue's to account
    (queued, then trained or unconsumed_at_shutdown), not also the rollouter's aborted_at_shutdown."""
    async def main():
        cfg, ro, replica, _ = _make()
        q = ro.mq = FakeFullQueue()
        await ro.start()
        await _settle(ro, lambda: len(q.pending) == sample_budget(cfg).max_required_samples)
        acc = await ro.stop()
        q.space.set()  # the queue's puts complete after the rollouter stopped waiting
        await asyncio.gather(*q.pending)
        return acc, len(q.items)

    acc, queued = asyncio.run(main())
    assert queued == 3 and acc["dropped"].get("aborted_at_shutdown", 0) == 0, acc
    assert acc["taken"] == queued + sum(acc["dropped"].values()) + sum(acc["failed"].values()), acc


def test_a_shutdown_in_process_queue_drops_the_waiting_puts_as_queue_shutdown_not_failures():
    """The colocated hf run's queue lives in the trainer's process (trainer/hybrid_rollout.in_process_queue): its
    QueueShutdown reaches the rollouter as itself, not inside a RayTaskError, and is the same drop."""
    from asyncrl.trainer.hybrid_rollout import in_process_queue

    async def main():
        cfg, ro, replica, _ = _make()  # budget: 3 groups may be out
        q = ro.mq = in_process_queue(1)  # room for one: two puts wait
        await ro.start()
        await _settle(ro, lambda: q.actor.body.waiting_putters == 2)
        assert await q.shutdown_async() == 1
        await _settle(ro, lambda: q.actor.body.waiting_putters == 0)
        acc = await ro.stop()
        return acc, await q.stats_async()

    acc, st = asyncio.run(main())
    assert acc["failed"] == {} and acc["enqueued"] == 1, acc
    assert st.drop_reasons == {"unconsumed_at_shutdown": 1, "queue_shutdown": 2} and st.puts == 1, st


class FakeBrokenReplica(FakeGatedReplica):
    """Every request raises, as an engine call whose client lacks a package (the H200 run's missing
    ``tenacity``: every sample failed the same way, ~350 per second, each with a traceback)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    async def generate(self, request_id, prompt_ids, sp):
        self.calls += 1
        raise ModuleNotFoundError("No module named 'tenacity'")


class FakeClosableQueue(FakeQueue):
    def __init__(self):
        super().__init__()
        self.shutdown_reasons = []

    async def shutdown_async(self, reason=""):
        self.shutdown_reasons.append(reason)
        return 0


def test_a_failure_storm_halts_rollout_and_shuts_the_queue_with_the_reason(ray_session, caplog):
    """max_consecutive_failures=6: after 6 prompt groups failed in a row with none succeeding, no new
    group starts and the queue is shut down with a reason naming the failure and the key; the
    traceback is logged once (first of its kind), not once per sample; every taken prompt is accounted."""
    async def main():
        cfg = smoke_cpu("d")
        cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 1
        cfg.async_training.require_batches = 2
        cfg.actor_rollout_ref.rollout.n = 2
        cfg.actor_rollout_ref.rollout.agent.num_workers = 0
        cfg.actor_rollout_ref.rollout.max_consecutive_failures = 6
        cfg.trainer.test_freq = 0
        rows = get_task_rows("arith", "train", 50, 0)
        replica, q = FakeBrokenReplica(), FakeClosableQueue()
        ro = FullyAsyncRollouter(cfg, rows, rows[:4], {"r0": replica}, FakePool(replica), q)
        await ro.start()
        await _settle(ro, lambda: bool(q.shutdown_reasons))
        calls = replica.calls
        await asyncio.sleep(0.3)
        assert replica.calls == calls, "groups kept starting after the halt"
        reason, = q.shutdown_reasons
        assert reason.startswith("rollout stopped: ") and "ModuleNotFoundError" in reason
        assert "No module named 'tenacity'" in reason and "max_consecutive_failures" in reason
        failed = sum(ro.failed.values())
        assert 6 <= failed <= 6 + sample_budget(cfg).max_concurrent_samples
        acc = await ro.stop()
        assert acc["taken"] == acc["enqueued"] + acc["pending"] + sum(acc["dropped"].values()) + sum(acc["failed"].values())
        assert acc["enqueued"] == 0
        tracebacks = [r for r in caplog.records if r.exc_info and "failed" in r.getMessage()]
        assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]
        # one ERROR line for the first failure, then a count at the 10th, 100th ...: not one line per sample
        # (session 31's user: ~130 ERROR lines for a broken reward)
        lines = [r.getMessage() for r in caplog.records if r.name == "asyncrl.rollouter" and r.levelname == "ERROR"
                 and "failed" in r.getMessage() and not r.getMessage().startswith("rollout stopped")]
        assert len(lines) == 1 + (failed >= 10), lines
        assert "(the first ModuleNotFoundError; later ones are counted, not logged one by one)" in lines[0], lines
    with caplog.at_level("INFO", logger="asyncrl"):
        asyncio.run(main())


@pytest.mark.timeout(60, method="thread")
def test_a_dataset_with_no_prompt_that_fits_halts_rollout_with_the_reason():
    """Every row longer than ``data.max_prompt_length`` (data the pre-flight check would refuse, here a rollouter
    started without it): the rollouter took and dropped the same 20 rows epoch after epoch (~1,250 in 3 s) and the
    trainer waited forever. Now, once every row has been dropped as too long, it starts nothing more and shuts the
    queue down with the reason (the trainer stops the run with it); every taken prompt is accounted."""
    async def main():
        cfg = smoke_cpu("d")
        cfg.actor_rollout_ref.rollout.agent.num_workers = 0
        cfg.trainer.test_freq = 0
        cfg.data.max_prompt_length = 1
        rows = get_task_rows("arith", "train", 20, 0)
        replica, q = FakeGatedReplica(), FakeClosableQueue()
        ro = FullyAsyncRollouter(cfg, rows, rows[:4], {"r0": replica}, FakePool(replica), q)
        await ro.start()
        await _settle(ro, lambda: bool(q.shutdown_reasons))
        taken = ro.counts["taken"]
        await asyncio.sleep(0.3)
        reason, = q.shutdown_reasons
        assert reason == ("rollout stopped: all 20 training prompts are longer than data.max_prompt_length=1 tokens, "
                          "so no prompt group can start; raise data.max_prompt_length or shorten the prompts")
        assert ro.halted and ro.counts["taken"] - taken <= sample_budget(cfg).max_required_samples + 1
        assert 20 <= ro.dropped["prompt_too_long"] <= 40  # each row once, at most a second epoch's worth in flight
        acc = await ro.stop()
        assert acc["taken"] == acc["enqueued"] + acc["pending"] + sum(acc["dropped"].values()) + sum(acc["failed"].values())
    asyncio.run(main())


def test_too_long_rows_survive_a_checkpoint_keyed_by_their_prompts():
    """The rows dropped as longer than data.max_prompt_length were not in the checkpoint (a resumed run found them
    again, one drop each, before it could halt); saved as bare indices they would name other rows on other data.
    Saved keyed by prompt (and the length limit and tokenizer), a resume keeps those that are still the same rows."""
    async def main():
        from asyncrl.checkpoint.trainer_state import rollouter_state

        cfg = smoke_cpu("d")
        cfg.actor_rollout_ref.rollout.agent.num_workers = 0
        cfg.trainer.test_freq = 0
        rows = get_task_rows("arith", "train", 20, 0)
        replica = FakeGatedReplica()

        def rollouter(train_rows, resume=None, max_prompt_length=None):
            c = smoke_cpu("d")
            c.actor_rollout_ref.rollout.agent.num_workers, c.trainer.test_freq = 0, 0
            c.data.max_prompt_length = max_prompt_length or cfg.data.max_prompt_length
            return FullyAsyncRollouter(c, train_rows, rows[:4], {"r0": replica}, FakePool(replica),
                                       FakeClosableQueue(), resume)

        ro = rollouter(rows)
        ro.too_long.update({2, 5, 11})
        state = rollouter_state(ro)
        assert state["too_long"]["rows"].keys() == {"2", "5", "11"}
        state.pop("ledger_parts")
        state["ledger"] = {"outcomes": {}, "in_flight": []}
        assert rollouter(rows, state).too_long == {2, 5, 11}  # the same data
        moved = rows[:5] + rows[6:] + [rows[5]]  # row 5 moved to the end, 11 now at 10: other rows at those indices
        assert rollouter(moved, state).too_long == {2}
        assert rollouter(rows, state, max_prompt_length=4096).too_long == set()  # another limit: measured anew
        old = {k: v for k, v in state.items() if k != "too_long"}  # a checkpoint from before they were saved
        assert rollouter(rows, old).too_long == set()
    asyncio.run(main())
