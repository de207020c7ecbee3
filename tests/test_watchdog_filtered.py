"""The hang watchdog names DAPO's filter_groups when it starves the trainer (groups generated, then dropped at the
trainer for want of reward variance): it said "generation in progress" before. Hand-made funnel states, no Ray."""

import asyncio

import pytest

from asyncrl.config import ExperimentConfig
from asyncrl.staleness import sample_budget
from asyncrl.watchdog import HangWatchdog, diagnose

BUDGET = sample_budget(ExperimentConfig())  # required 32, max_required 48, max_concurrent 48


def funnel(**kw):
    base = {"pending": 10, "active": 5, "paused": False, "staleness_samples": 20, "taken": 100, "enqueued": 80,
            "dropped": {}, "failed": {}, "replicas_in_pool": 1, "replicas_total": 1, "queue_size": 3,
            "trainer_phase": "fetch", "trainer_phase_s": 1.0, "global_steps": 4, "oldest_active_s": 12.0,
            "time": 1000.0, "queue_gets": 200, "queue_drops": {"dapo_no_signal": 50, "stale_at_trainer": 2}}
    base.update(kw)
    return base


def test_groups_dropped_by_filter_groups_are_named_with_their_counts():
    """As in the real stall, the staleness budget reads full: each dropped group releases budget the rollouter refills
    at once. It was checked first, and the watchdog said "staleness budget exhausted ... no new sample starts until a
    sync", which was false and pointed at the staleness keys."""
    start = funnel(staleness_samples=48, active=32, queue_size=16, filtered_scores={0.0: 50})
    now = funnel(time=1150.0, queue_gets=296, queue_drops={"dapo_no_signal": 146, "stale_at_trainer": 2},
                 staleness_samples=48, active=48, queue_size=16, taken=196, enqueued=176,
                 filtered_scores={0.0: 146})  # all 48 slots busy: before, "concurrency"
    d = diagnose(now, BUDGET, 301.0, previous=None, window_start=start)
    assert d.binding == "filtered", d.message
    assert "algorithm.filter_groups dropped 96 of the 96 prompt groups generated and fetched by the trainer in the " \
           "last 150 s of those 301 s (no reward variance: every response of every dropped group scored 0: the data is too hard for " \
           "the model, or the reward never matches its ground truth)" in d.message
    assert "algorithm.filter_groups.enable=false" in d.message
    assert "algorithm.filter_groups.max_num_gen_batches=K" in d.message and "lower the filter" not in d.message
    # without a window start the previous check's state is the window
    assert diagnose(now, BUDGET, 301.0, previous=start).binding == "filtered"


def test_groups_fetched_before_the_window_and_dropped_in_it_count_as_fetched():
    """The real run said "dropped 808 of the 800": the trainer takes a batch (gets +32) and records its drops after."""
    start = funnel(queue_gets=232, queue_drops={"dapo_no_signal": 50})
    now = funnel(time=1150.0, queue_gets=1032, queue_drops={"dapo_no_signal": 858})
    d = diagnose(now, BUDGET, 301.0, window_start=start)
    assert "dropped 808 of the 808 prompt groups" in d.message, d.message


def test_the_user_repro_names_filter_groups_not_the_staleness_budget():
    s = funnel(staleness_samples=48, active=32, queue_size=16)
    n = funnel(staleness_samples=48, active=32, queue_size=16, time=1040., queue_gets=296,
               queue_drops={"dapo_no_signal": 146})
    d = diagnose(n, BUDGET, 40., s, s)
    assert d.binding == "filtered" and "staleness budget" not in d.message, d.message
    # no scores known (an older trainer): the message says what it can
    assert "every response of a group got the same score" in d.message


@pytest.mark.parametrize("scores,says", [
    ({1.0: 96}, "every response of every dropped group scored 1: the data is too easy for the model"),
    ({0.0: 90, 1.0: 6}, "90 of the 96 dropped groups scored 0 on every response: the data is too hard"),
    ({-0.5: 96}, "scored -0.5: the reward gives every sample the same score"),  # a shaped metric
])
def test_the_message_says_what_the_dropped_groups_scored(scores, says):
    start = funnel(filtered_scores={0.0: 10, 1.0: 10})
    now = funnel(time=1150.0, queue_gets=296, queue_drops={"dapo_no_signal": 146},
                 filtered_scores={k: v + start["filtered_scores"].get(k, 0) for k, v in scores.items()})
    d = diagnose(now, BUDGET, 301.0, window_start=start)
    assert d.binding == "filtered" and says in d.message, d.message


@pytest.mark.parametrize("now,binding", [
    (funnel(time=1150.0, queue_gets=296), "generation"),  # nothing filtered in the window
    (funnel(time=1150.0, queue_gets=296, queue_drops={"dapo_no_signal": 90}), "generation"),  # 40 of 96: a minority
    (funnel(time=1150.0, queue_gets=296, queue_drops={"dapo_no_signal": 90}, active=48), "concurrency"),
    (funnel(pending=0, active=0), "feed"),
    (funnel(staleness_samples=48), "staleness_budget"),  # no group filtered in the window
    (funnel(time=1150.0, queue_gets=296, queue_drops={"dapo_no_signal": 90}, staleness_samples=48),
     "staleness_budget"),  # 40 of 96 filtered: a minority does not explain a full budget
    (funnel(trainer_phase="update", trainer_phase_s=400, queue_drops={"dapo_no_signal": 500}), "trainer_update"),
])
def test_other_limits_keep_their_diagnosis(now, binding):
    assert diagnose(now, BUDGET, 301.0, previous=funnel(), window_start=funnel()).binding == binding


def test_states_without_queue_counters_keep_the_old_diagnoses():
    """Funnel states of the old shape (no ``queue_drops`` / ``queue_gets``) are never diagnosed ``filtered``."""
    old = {k: v for k, v in funnel().items() if k not in ("time", "queue_gets", "queue_drops")}
    assert diagnose(old, BUDGET, 301.0, previous=old, window_start=old).binding == "generation"


class _FakeClock:
    """Stands in for the ``time`` module the watchdog reads (``time.time()`` only)."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now


def _second_check(monkeypatch, timeout_s, first, second):
    """A watchdog started at t=1000 s checked at ``first = (t, funnel)`` (no diagnosis yet: its window opens) and at
    ``second``; returns the second check's diagnosis."""
    clock = _FakeClock(first[0])
    monkeypatch.setattr("asyncrl.watchdog.time", clock)
    states = iter([first[1], second[1]])

    async def read_funnel():
        return next(states)

    async def scenario():
        wd = HangWatchdog(timeout_s, BUDGET, lambda: 1000.0, read_funnel)
        assert await wd.check() is None
        clock.now = second[0]
        return await wd.check()

    return asyncio.run(scenario())


@pytest.mark.timeout(30, method="thread")
def test_the_first_warning_counts_from_half_the_timeout(monkeypatch):
    """The watchdog reads the funnel once at half the timeout; its first overdue check counts the filtered groups
    from there (it had no window on its first check before, so the first warning blamed generation)."""
    d = _second_check(monkeypatch, 100.0, (1060.0, funnel(staleness_samples=48)),  # 60 s of 100: the window opens
                      (1101.0, funnel(time=1101.0, queue_gets=264, queue_drops={"dapo_no_signal": 114}, staleness_samples=48)))
    assert d is not None and d.binding == "filtered", d
    assert "dropped 64 of the 64 prompt groups generated and fetched by the trainer in those 101 s" in d.message


@pytest.mark.timeout(30, method="thread")
def test_the_first_warning_names_its_window_as_part_of_the_stall(monkeypatch):
    """A 30 s timeout warned "no trainer step for 30 s ...: ... dropped ... in the last 15 s", as if the watchdog
    looked at less than its own timeout: the count's window (from half the timeout) is named as a part of the stall."""
    d = _second_check(monkeypatch, 30.0, (1016.0, funnel(time=1015.0, staleness_samples=48)),  # 16 s of 30: opens
                      (1030.0, funnel(time=1030.0, queue_gets=264, queue_drops={"dapo_no_signal": 114}, staleness_samples=48)))
    assert d is not None and d.message.startswith("no trainer step for 30 s "), d
    assert "fetched by the trainer in the last 15 s of those 30 s (" in d.message, d.message
    # a window as long as the stall is named as the stall
    d = diagnose(funnel(time=1040.0, queue_gets=296, queue_drops={"dapo_no_signal": 146}), BUDGET, 40.0,
                 window_start=funnel())
    assert "fetched by the trainer in those 40 s (" in d.message, d.message


def test_short_steps_cost_no_funnel_call(monkeypatch):
    clock = _FakeClock(1040.0)
    monkeypatch.setattr("asyncrl.watchdog.time", clock)

    async def read_funnel():
        raise AssertionError("funnel read before half the timeout")

    assert asyncio.run(HangWatchdog(100.0, BUDGET, lambda: 1000.0, read_funnel).check()) is None
