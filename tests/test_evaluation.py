"""Held-out evaluation survives a failing sample (issue 12): counted with its reason, never fatal.

The rollouter runs in-process with the fakes of test_rollouter.py (a gated fake replica, pool and
queue) and a fake agent loop that raises, registered as ``fake_raising_agent`` and picked by one
held-out row's ``agent_name``. The real stack is covered by tests/test_faults.py (an evaluation
sample that raises in a live run) and tests/test_e2e_tasks.py (the swe pipeline).
"""

from __future__ import annotations

import asyncio
import logging

from test_rollouter import _make, _settle

from asyncrl.agent_loop.base import AgentLoopBase, register


class FakeAgentError(RuntimeError):
    """What the fake agent raises."""


@register("fake_raising_agent")
class FakeRaisingAgentLoop(AgentLoopBase):
    """An agent loop whose every trajectory raises (a crashed agent, a tool that takes it down)."""

    calls = 0

    async def run(self, sampling_params, **sample):
        type(self).calls += 1
        raise FakeAgentError(f"fake agent fault on {sample['request_id']}")


def test_an_eval_sample_that_raises_is_counted_and_the_run_goes_on(ray_session, caplog):
    """4 held-out rows: one agent raises, one prompt is longer than data.max_prompt_length. Before the
    fix the first exception escaped asyncio.gather and ended evaluate() (and, at the run's final
    evaluation, Experiment.finish); now 2 are scored and 2 failed, each with its reason."""
    FakeRaisingAgentLoop.calls = 0

    async def main():
        cfg, ro, replica, q = _make()
        ro.val_rows = [dict(r) for r in ro.val_rows[:4]]
        ro.val_rows[1]["agent_name"] = "fake_raising_agent"
        ro.val_rows[2]["prompt"] = [{"role": "user", "content": "1 + " * cfg.data.max_prompt_length}]
        await ro.start()
        direct = await ro.evaluate()  # as Experiment.finish calls it
        ro.start_evaluation()  # as a sync starts it (trainer.test_freq), in the background
        await ro.wait_evaluation()
        await _settle(ro, lambda: len(q.items) == 3)  # training rollout went on meanwhile
        acc = await ro.stop()
        return ro, direct, acc

    with caplog.at_level(logging.WARNING, logger="asyncrl.evaluation"):
        ro, direct, acc = asyncio.run(main())
    assert FakeRaisingAgentLoop.calls == 2  # one per evaluation: the fault really fired
    assert len(ro.eval_history) == 2 and ro.eval_history[0] is direct
    for ev in ro.eval_history:
        assert ev["n"] == 2 and ev["eval/failed"] == 2, ev
        assert ev["eval/failed_reasons"] == {"FakeAgentError": 1, "prompt_too_long": 1}, ev
        assert 0.0 <= ev["accuracy"] <= 1.0
        # what the summary needs to say what a figure is: rows evaluated, and the arith rule's 0/1 score (an accuracy)
        assert ev["rows"] == 4 and ev["accuracy_of"] == "rule", ev
    # logged once per reason per evaluation, with the first message
    lines = [r.getMessage() for r in caplog.records if r.name == "asyncrl.evaluation"]
    assert len(lines) == 4 and sum("FakeAgentError" in m and "fake agent fault" in m for m in lines) == 2, lines
    # the agent's failure is on the dashboard's recent failures, tagged as an evaluation
    rec = [f for f in ro.failures.snapshot() if f.get("phase") == "eval"]
    assert [f["type"] for f in rec] == ["FakeAgentError", "FakeAgentError"] and rec[0]["uid"].startswith("eval-0-")
    # training accounting is untouched by evaluation failures (held-out rows are not dataloader prompts),
    # and they do not count toward rollout.max_consecutive_failures (a failure storm halts training rollout)
    assert acc["failed"] == {} and acc["enqueued"] == 3
    assert ro.failures.consecutive == 0 and not ro.halted


def test_what_an_evaluations_accuracy_is_the_mean_of():
    """Session 31: a custom reward without an ``acc`` extra gave its mean score under "held-out greedy accuracy"."""
    import types

    from asyncrl.evaluation import accuracy_of
    from asyncrl.recipes import smoke_cpu

    cfg = smoke_cpu("d")
    out = types.SimpleNamespace
    assert accuracy_of([out(metrics={"reward/acc": 1.0}), out(metrics={"reward/acc": 0.0})], cfg) == "acc"
    assert accuracy_of([out(metrics={})], cfg) == "rule"  # a built-in rule: 1 correct, 0 not
    cfg.custom_reward_function.path = "mytask/my_reward.py"
    assert accuracy_of([out(metrics={})], cfg) == "score" and accuracy_of([], cfg) == "score"
    assert accuracy_of([out(metrics={"reward/acc": 1.0})], cfg) == "acc"


def test_a_run_without_held_out_rows_evaluates_nothing(ray_session):
    """``data.train_files`` without ``data.val_files``: no held-out rows (``run_rows``), so the version-0, periodic and
    final evaluations record nothing (they evaluated 200 generated arith rows with the user's reward before)."""
    async def main():
        cfg, ro, replica, q = _make()
        ro.val_rows = []
        await ro.start()
        direct = await ro.evaluate()  # as Experiment.finish calls it
        ro.start_evaluation()
        await ro.wait_evaluation()
        await ro.stop()
        return ro, direct

    ro, direct = asyncio.run(main())
    assert direct == {} and ro.eval_history == []
