"""FailureLog's consecutive-failure bookkeeping and the MessageQueue's shutdown reason (issue 12:
a failure storm stops the run with its reason instead of failing new prompts forever)."""

import asyncio

import pytest

from asyncrl.failures import FailureLog, RolloutStopped, raise_if_rollout_stopped


def test_consecutive_failures_end_at_a_success_and_name_the_most_common_kind():
    log = FailureLog()
    for _ in range(3):
        log.record(ValueError("bad reward"), "u")
    assert log.storm_message(4) is None and log.consecutive == 3
    log.success()
    assert log.consecutive == 0
    log.record(KeyError("x"), "u")
    for _ in range(3):
        log.record(ModuleNotFoundError("No module named 'tenacity'"), "u")
    msg = log.storm_message(4)
    assert msg.startswith("4 prompt groups failed in a row") and "ModuleNotFoundError x3, KeyError x1" in msg
    assert "No module named 'tenacity'" in msg and "actor_rollout_ref.rollout.max_consecutive_failures" in msg
    assert log.storm_message(0) is None  # 0 = never stop
    assert log.counts == {"ValueError": 3, "KeyError": 1, "ModuleNotFoundError": 3}  # totals survive a success


def test_tracebacks_at_the_first_tenth_hundredth_failure_of_a_kind():
    log = FailureLog()
    firsts = []
    for i in range(1, 120):
        log.record(RuntimeError("x"))
        if log.first_of_kind("RuntimeError"):
            firsts.append(i)
    assert firsts == [1, 10, 100]


def test_queue_shut_down_with_a_reason_makes_the_trainer_raise(ray_session):
    from asyncrl.message_queue import MessageQueue

    async def main():
        normal, stopped = MessageQueue(4), MessageQueue(4)
        await normal.shutdown_async()
        await raise_if_rollout_stopped(normal)  # a normal end: no error
        await stopped.shutdown_async("rollout stopped: 6 prompt groups failed in a row")
        await stopped.shutdown_async("a later reason")  # the first reason stays
        assert (await stopped.stats_async()).shutdown_reason == "rollout stopped: 6 prompt groups failed in a row"
        with pytest.raises(RolloutStopped, match="6 prompt groups failed in a row"):
            await raise_if_rollout_stopped(stopped)
        assert await stopped.get_samples_async(1) is None
    asyncio.run(main())


def test_a_failure_message_is_cut_at_a_word_not_mid_word():
    """Session 31: the per-kind failure count lines cut a reward error at 200 characters mid-word (`{"score":`,
    `gradie`), losing its fix; now its first line whole up to 400 characters, else cut at a word with ' ...'."""
    from asyncrl.failures import short_message

    hint = "return a float or {\"score\": float, ...}"
    msg = "custom reward /some/long/path/" + "x" * 150 + ".py:compute_score returned None for data_source 'my_sum': " + hint
    assert short_message(ValueError(msg + "\nsecond line")) == msg  # under 400: whole, the first line only
    long = " ".join(["word"] * 150)
    cut = short_message(ValueError(long))
    assert len(cut) <= 400 and cut.endswith("word ...") and short_message(ValueError("")) == ""
