"""Replica faults and the hang watchdog without Ray processes: the client moves a request off a
failed replica, the balancer stops routing to it, the monitor brings a restarted one back, and the
watchdog names the binding limit. Live runs with real faults: tests/test_faults.py."""

from __future__ import annotations

import asyncio

import pytest
from fake_replica import FakeAbortingReplica
from ray.exceptions import ActorDiedError

from asyncrl.config import ConfigError, ExperimentConfig
from asyncrl.rollout.base import SamplingParams, TokenOutput
from asyncrl.rollout.client import FullyAsyncLLMServerClient
from asyncrl.rollout.health import ReplicaFault, ReplicaMonitor, ReplicaUnavailable
from asyncrl.rollout.load_balancer import LocalRequestLoadBalancer
from asyncrl.staleness import sample_budget
from asyncrl.trainer.fault_tolerance import FaultTolerantSync
from asyncrl.watchdog import check_can_fill_batch, diagnose


class FakeDyingReplica:
    """Serves ``good_calls`` calls, then every call fails as a dead Ray actor would."""

    def __init__(self, good_calls: int = 0, error: BaseException | None = None):
        self.good_calls, self.calls = good_calls, 0
        self.error = error or ActorDiedError()

    async def generate(self, request_id, prompt_ids, sp):
        self.calls += 1
        if self.calls > self.good_calls:
            raise self.error
        return TokenOutput([7, 7], [-0.1, -0.1], "aborted", response_versions=[0, 0])  # 2 tokens, then a "sync"


def test_request_moves_to_another_replica_with_its_tokens_and_balancer_stops_routing():
    dying, healthy = FakeDyingReplica(good_calls=1), FakeAbortingReplica(natural_len=6)
    lb = LocalRequestLoadBalancer({"r0": dying, "r1": healthy})
    client = FullyAsyncLLMServerClient(lb)

    async def main():
        return await client.generate("req", [1, 2, 3], SamplingParams(max_tokens=8))

    out = asyncio.run(main())
    assert out.token_ids[:2] == [7, 7]  # generated on r0 before it died: kept
    assert len(out.token_ids) <= 8 and out.stop_reason == "completed"  # the budget spans both replicas
    assert healthy.calls[0][1] == 5  # r1 continued from prompt + the 2 tokens
    assert out.replica_faults == 1 and client.replica_faults_total == 1 and out.server_ids[-1] == "r1"
    snap = lb.snapshot()
    assert snap["failed"] == ["r0"] and "r0" not in snap["in_flight"] and snap["total_in_flight"] == 0
    assert asyncio.run(lb.acquire_server_async("other"))[0] == "r1"  # never routed to r0 again


def test_a_restarted_replica_refusing_is_a_fault_too_and_faults_are_bounded():
    lb = LocalRequestLoadBalancer({"r0": FakeDyingReplica(error=ReplicaUnavailable("restarted"))})
    client = FullyAsyncLLMServerClient(lb, max_replica_faults=0, replica_wait_s=0.2)
    with pytest.raises(ReplicaFault, match="r0"):
        asyncio.run(client.generate("req", [1], SamplingParams(max_tokens=4)))


def test_empty_pool_waits_for_a_replica_to_come_back():
    lb = LocalRequestLoadBalancer({"r0": FakeDyingReplica()})
    client = FullyAsyncLLMServerClient(lb, replica_wait_s=30)

    async def main():
        async def rejoin():
            while "r0" not in lb.snapshot()["failed"]:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            lb.add_servers({"r0": FakeAbortingReplica(natural_len=3)})  # restarted incarnation

        task = asyncio.create_task(rejoin())
        out = await client.generate("req", [1], SamplingParams(max_tokens=5))
        await task
        return out

    out = asyncio.run(main())
    assert out.stop_reason == "completed" and out.replica_faults == 1 and lb.snapshot()["failed"] == []


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class FakeActorHandle:
    """Stand-in for a Ray actor handle with an async ``ready.remote()``."""

    def __init__(self, dead: bool = False):
        async def ready():
            await asyncio.sleep(0.05)  # a restart takes a moment
            if dead:
                raise ActorDiedError()
            return True

        self.ready = _Remote(ready)


def test_monitor_brings_a_restarted_replica_back_and_gives_up_on_a_dead_one():
    handles = {"r0": FakeActorHandle(), "r1": FakeActorHandle(dead=True)}
    lb = LocalRequestLoadBalancer(handles)
    calls = []

    async def down(sid):
        calls.append(("down", sid))

    async def rejoin(sid):
        calls.append(("rejoin", sid))
        return 7

    async def main():
        mon = ReplicaMonitor(handles, lb, down, rejoin, poll_s=0.02)
        mon.start()
        lb.report_failure("r0", "ActorDiedError")
        lb.report_failure("r1", "ActorDiedError")
        assert not lb.report_failure("r1", "again")  # one removal per failure
        for _ in range(200):
            await asyncio.sleep(0.02)
            if mon.rejoined and mon.dead:
                break
        await mon.stop()
        return mon

    mon = asyncio.run(main())
    assert mon.rejoined == [("r0", 7)] and mon.dead == {"r1"}
    assert ("down", "r0") in calls and ("rejoin", "r0") in calls and ("rejoin", "r1") not in calls
    assert lb.servers() == ["r0"] and lb.snapshot()["failed"] == ["r1"]


class _Health:
    def __init__(self, weights_current: bool):
        self.weights_current = weights_current
        self.health = _Remote(self._health)

    async def _health(self):
        return {"restarted": not self.weights_current, "weights_current": self.weights_current}


class _SyncingTrainer(FaultTolerantSync):
    """FaultTolerantSync with a fake sender / synchronizer: a sync hands the weights to every live replica."""

    def __init__(self, replicas):
        self.engine = object()  # no named_tensors_for_sync in this process: rejoin takes the full-sync path
        self.param_version, self.global_steps, self.synced_step = 3, 5, 4
        self.reported = []
        self.synchronizer = self
        self.rollouter = self
        self.report_replica_failure = _Remote(self._report)
        self.cfg = ExperimentConfig()
        self.weight_sender = self._init_replicas(replicas, self)

    async def _report(self, sid, reason):
        self.reported.append(sid)

    async def set_receivers(self, handles):
        self.receivers = list(handles)

    async def sync(self, version):
        for h in self.receivers:
            h.weights_current = True
        return {}


def test_a_restarted_replica_rejoining_through_a_full_sync_gets_the_weights():
    """Mid-window (trainer weights newer than the replicas') a rejoin is a full sync; the sync's health
    probe must not drop the replica it is bringing up to date (it has no current weights yet, by design)."""
    handles = {"r0": _Health(True), "r1": _Health(False)}
    tr = _SyncingTrainer(handles)
    tr.live.pop("r1")  # down since the crash

    version = asyncio.run(tr.rejoin_replica("r1"))
    assert version == 4 and handles["r1"].weights_current and "r1" in tr.live and tr.reported == []
    assert [e[:2] for e in tr.replica_events] == [("rejoined", "r1")]
    handles["r0"].weights_current = False  # a restarted replica nobody is bringing back: it leaves
    tr.global_steps += 1
    asyncio.run(tr._sync_weights())
    assert "r0" not in tr.live and tr.reported == ["r0"]


# ------------------------------------------------------------------------------ watchdog
BUDGET = sample_budget(ExperimentConfig())  # required 32, max_required 48, max_concurrent 48


def funnel(**kw):
    base = {"pending": 10, "active": 5, "paused": False, "staleness_samples": 20, "taken": 100, "enqueued": 80,
            "dropped": {}, "failed": {}, "replicas_in_pool": 1, "replicas_total": 1, "queue_size": 3,
            "trainer_phase": "fetch", "trainer_phase_s": 1.0, "global_steps": 4, "oldest_active_s": 12.0}
    base.update(kw)
    return base


@pytest.mark.parametrize("state,previous,binding", [
    (funnel(trainer_phase="sync", trainer_phase_s=400), None, "trainer_sync"),
    (funnel(replicas_in_pool=0), None, "no_replica"),
    (funnel(paused=True), None, "paused"),
    (funnel(staleness_samples=48, active=0), None, "staleness_budget"),
    (funnel(active=0, taken=140, dropped={"prompt_too_long": 40}), funnel(taken=100), "dropped"),
    (funnel(active=0, taken=140, failed={"ValueError: x": 40}), funnel(taken=100), "failed"),
    (funnel(active=48), None, "concurrency"),
    (funnel(pending=0, active=0), None, "feed"),
    (funnel(), None, "generation"),
])
def test_watchdog_names_the_binding_limit(state, previous, binding):
    d = diagnose(state, BUDGET, 301.0, previous)
    assert d.binding == binding, d.message
    assert d.message.startswith("no trainer step for 301 s (step 5 needs 32 samples, queue has 3)")
    if binding == "staleness_budget":
        assert "staleness_samples 48 >= max_required_samples 48" in d.message
    if binding == "dropped":
        assert "prompt_too_long 40" in d.message and "data.max_prompt_length" in d.message


def test_data_that_can_never_fill_a_step_is_refused_at_start(model_dir):
    from asyncrl.data.arith import make_arith_rows
    from asyncrl.models import load_tokenizer

    cfg = ExperimentConfig()
    tok = load_tokenizer(cfg.actor_rollout_ref.model.path)
    rows = make_arith_rows(40, 0, "+", "train")
    assert check_can_fill_batch(rows, cfg, tok) == 32  # passes after rendering one step's worth
    with pytest.raises(ConfigError, match=r"has 5 prompts but one trainer step needs required_samples = "
                                          r"ppo_mini_batch_size 16 x async_training.require_batches 2 = 32"):
        check_can_fill_batch(rows[:5], cfg, tok)
    cfg.data.max_prompt_length = 3
    with pytest.raises(ConfigError, match=r"only 0 of 40 prompts fit data.max_prompt_length=3"):
        check_can_fill_batch(rows, cfg, tok)


def test_dashboard_header_shows_the_watchdog_diagnosis():
    from widgets.dashboard import Dashboard

    d = diagnose(funnel(staleness_samples=48, active=0), BUDGET, 301.0)
    snap = {"name": "run", "state": "running", "watchdog": d.to_dict(),
            "trainer": {"global_steps": 4, "history": [], "watchdog": d.to_dict()}, "rollouter": {}}
    html = Dashboard(snap, autostart=False).to_html()
    assert "watchdog: no trainer step for 301 s" in html and "staleness budget exhausted" in html
