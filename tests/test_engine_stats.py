"""Engine iteration statistics (``rollout/engine_*``): the window's sums and metrics by hand, and the real
engines' counts against what they generated (hf on a random Qwen2; vLLM on the session replica)."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.engine_stats import IterationWindow, merge_windows, window_metrics


def test_window_sums_and_metrics_by_hand(monkeypatch):
    clock = iter([100.0, 102.0, 104.0])  # open, take (2 s), the second window's take (2 s)
    monkeypatch.setattr("asyncrl.rollout.engine_stats.time.monotonic", lambda: next(clock))
    w = IterationWindow()
    w.record(0.2, 4, 4, 40)  # a prefill of 4 prompts (10 tokens each)
    w.record(0.1, 4, 4, 0)  # two decode steps of 4
    w.record(0.3, 2, 2, 0)
    w.record(0.5, 0, 0, 0)  # nothing scheduled: not an iteration
    got = w.take()
    assert got == {"iterations": 3, "decode_iterations": 2, "busy_s": pytest.approx(0.6), "decode_busy_s": pytest.approx(0.4),
                   "seqs": 10, "decode_seqs": 6, "generated_tokens": 10, "prefill_tokens": 40, "wall_s": 2.0,
                   "replicas": 1}
    m = window_metrics(merge_windows([got]))
    assert m == {"rollout/engine_busy_ratio": pytest.approx(0.3), "rollout/engine_batch_mean": pytest.approx(10 / 3),
                 "rollout/engine_decode_ms": pytest.approx(200.0), "rollout/engine_tokens_per_s": pytest.approx(5.0),
                 "rollout/engine_generated_tokens": 10.0, "rollout/engine_iterations": 3.0}
    # the window restarted: a second replica's window over the same 2 s merges by adding
    w.record(1.0, 8, 8, 0)
    other = w.take()
    assert other["iterations"] == 1 and other["wall_s"] == 2.0
    both = window_metrics(merge_windows([got, other, {}, None]))  # {} / None: replicas without statistics
    assert both["rollout/engine_busy_ratio"] == pytest.approx((0.6 + 1.0) / 4.0)  # mean over the 2 replicas
    assert both["rollout/engine_tokens_per_s"] == pytest.approx(18 / 2.0)  # all replicas together
    assert both["rollout/engine_decode_ms"] == pytest.approx(1e3 * 1.4 / 3)
    assert window_metrics(merge_windows([{}, None])) == {}  # no replica kept statistics: no columns


def test_hf_engine_counts_every_generated_token(random_model_dir):
    from asyncrl.rollout.hf_backend import HFEngine

    prompts = [[5 + i, 6, 7 + i] for i in range(6)]
    sp = SamplingParams(max_tokens=7, temperature=1.0, ignore_eos=True)

    async def main():
        eng = HFEngine(str(random_model_dir), max_num_seqs=4, max_model_len=64)
        await eng.start()
        try:
            eng.iteration_window.take()  # start-up leaves nothing to count, but start from zero anyway
            outs = await asyncio.gather(*(eng.generate(f"r{i}", p, sp) for i, p in enumerate(prompts)))
            return outs, eng.iteration_window.take()
        finally:
            await eng.shutdown()

    outs, w = asyncio.run(main())
    assert sum(len(o.token_ids) for o in outs) == w["generated_tokens"] == 6 * 7
    assert w["prefill_tokens"] == sum(map(len, prompts))
    # 4 slots: at most 4 sequences an iteration; 6 requests of 7 tokens: two waves of >= 6 steps each
    assert w["iterations"] >= 12 and w["seqs"] <= 4 * w["iterations"]
    assert 0 < w["busy_s"] <= w["wall_s"]


def test_hf_engine_without_stats_keeps_no_window(random_model_dir):
    from asyncrl.rollout.hf_backend import HFEngine
    from asyncrl.rollout.replica import _ReplicaActor

    assert HFEngine(str(random_model_dir), iteration_stats=False).iteration_window is None
    body = _ReplicaActor.__new__(_ReplicaActor)  # the actor's method on an engine without a window
    body.engine = HFEngine(str(random_model_dir), iteration_stats=False)
    assert body.iteration_stats() == {}


def test_config_key_turns_collection_off():
    from asyncrl.recipes import smoke_cpu
    from asyncrl.rollout.replica import engine_kwargs_from_config

    cfg = smoke_cpu("d")
    assert engine_kwargs_from_config(cfg)["iteration_stats"] is True
    cfg.actor_rollout_ref.rollout.disable_log_stats = True
    assert engine_kwargs_from_config(cfg)["iteration_stats"] is False


@pytest.mark.vllm
def test_vllm_replica_counts_every_generated_token(shared_replica):
    """vLLM's per-step ``iteration_details`` through the replica actor: every token the requests got was
    counted, in iterations of at most the requests in flight."""
    import ray

    ray.get(shared_replica.actor.iteration_stats.remote())  # restart the window
    sp = SamplingParams(max_tokens=9, temperature=1.0, ignore_eos=True)
    prompts = [[5 + i, 6, 7] for i in range(8)]
    outs = ray.get([shared_replica.generate_async(f"itstats-{i}", p, sp) for i, p in enumerate(prompts)])
    w = ray.get(shared_replica.actor.iteration_stats.remote())
    assert w["generated_tokens"] == sum(len(o.token_ids) for o in outs) == 8 * 9
    assert w["prefill_tokens"] == sum(map(len, prompts))
    assert 9 <= w["iterations"] and w["seqs"] <= 8 * w["iterations"]
    assert w["decode_iterations"] >= 8 and 0 < w["decode_busy_s"] <= w["busy_s"] <= w["wall_s"]
    m = window_metrics(merge_windows([w]))
    assert 1 <= m["rollout/engine_batch_mean"] <= 8 and m["rollout/engine_decode_ms"] > 0


def test_the_simulator_reports_the_engine_statistics_unless_disable_log_stats():
    from asyncrl.recipes import smoke_cpu
    from asyncrl.sim import simulate
    from asyncrl.sim.presets import cpu_embedded_vllm

    cfg = smoke_cpu("d")
    on = simulate(cfg, cpu_embedded_vllm())
    assert all(0 < row["rollout/engine_busy_ratio"] <= 1 and row["rollout/engine_batch_mean"] >= 1 for row in on.history)
    cfg.actor_rollout_ref.rollout.disable_log_stats = True
    off = simulate(cfg, cpu_embedded_vllm())
    assert not any(k.startswith("rollout/engine_") for row in off.history for k in row)
    assert all("rollouter/idle_ratio" in row for row in off.history)
