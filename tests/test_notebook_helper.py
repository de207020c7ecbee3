"""asyncrl.notebook: claims, progress lines, teardown order (no Ray, no engine)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pandas as pd
import pytest

from asyncrl.notebook import Claim, ClaimFailed, NotebookSession, Progress, RunResult


def test_claim_passes_with_evidence_and_fails_with_the_text_and_the_measurement(capsys):
    nb = NotebookSession("t")
    assert nb.claim("mode d shows at least one partial rollout", 3, "3 partial samples") is None  # no stray repr
    assert "✓ mode d shows at least one partial rollout  (3 partial samples)" in capsys.readouterr().out
    with pytest.raises(ClaimFailed, match=r"the text says: 'the queue binds', but this run shows: active_tasks"):
        nb.claim("the queue binds", False, "active_tasks")
    assert [x.ok for x in nb.checked] == [True, False]
    with pytest.raises(TypeError, match="text is the claim in the chapter's words, got 5"):
        nb.claim(5, True)


def test_a_claim_the_run_cannot_decide_is_shown_unchecked_not_failed(capsys):
    """Notebook 06 with ``-p measured_steps 4``: the measured speed-up of a 4-step run (mostly warm-up) read 1.00x
    and stopped the chapter before its last four sections (session 30). A claim the run is too small to decide
    says so instead, whatever its value; the summary keeps it apart from the passed ones."""
    nb = NotebookSession("t")
    assert nb.claim("async is faster", False, "1.00x", unchecked="4 steps are too few") is None
    assert "– async is faster  (not checked: 4 steps are too few)" in capsys.readouterr().out
    nb.claim("b", True)
    assert repr(nb.claims()) == "– async is faster  (not checked: 4 steps are too few)\n✓ b"
    assert "claims=1/1)" in repr(nb)
    with pytest.raises(ClaimFailed):
        nb.claim("async is faster", False, "1.00x", unchecked="")


def test_claims_summary_is_stable_text_without_evidence():
    nb = NotebookSession("t")
    nb.claim("a", True, "1.23 s")
    nb.claim("b", True, "0.456")
    assert repr(nb.claims()) == "✓ a\n✓ b"
    assert "<li>✓ a</li>" in nb.claims()._repr_html_()


def test_smoke_follows_ci(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "1")
    assert NotebookSession("t").smoke
    monkeypatch.delenv("CI")
    nb = NotebookSession("t", snapshot_dir=str(tmp_path))
    assert not nb.smoke and nb.snapshot_dir == tmp_path and nb.log_dir == tmp_path / "logs"


def test_progress_outside_a_notebook_logs_start_and_end(caplog):
    caplog.set_level("INFO", logger="asyncrl.notebook")

    async def main():
        async with Progress("starting something", tick_s=0.01) as p:
            await asyncio.sleep(0.03)
            p.done("something ready")

    asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == ["starting something ...", "something ready"]


def test_close_shuts_tracked_things_newest_first_and_keeps_going_after_an_error():
    closed = []

    class Replica:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def shutdown(self):
            closed.append(self.name)
            if self.fail:
                raise RuntimeError("already dead")

    class Exp:
        def stop(self):
            closed.append("exp")

        async def wait_async(self):  # marks it as an Experiment
            return None

    nb = NotebookSession("t")
    nb.track(Replica("r0"))
    nb.track(Replica("r1", fail=True))
    nb.track(Exp())
    nb.close()
    nb.close()  # idempotent
    assert closed == ["exp", "r1", "r0"]


def test_run_result_counts_partial_samples():
    assert RunResult(summary=None, history=pd.DataFrame({"rollouter/partial_count": [0, 2, 1]})).partial_samples == 3
    assert RunResult(summary=None, history=pd.DataFrame()).partial_samples == 0


def test_claim_line():
    assert Claim("x", False, "y").line() == "✗ x  (y)"


def test_run_summary_shows_what_is_not_zero_and_explains_shutdown_drops():
    from asyncrl.experiment import Summary

    evals = [{"version": 0, "accuracy": 0.5, "eval/tool_calls": 0.75, "eval/tool_errors/timeout": 0.0,
              "eval/tool_call_success_rate": 0.5, "eval/tool_s": 0.002},
             {"version": 2, "accuracy": 0.5, "eval/tool_calls": 0.8, "eval/tool_errors/timeout": 0.0,
              "eval/tool_call_success_rate": 0.75, "eval/tool_s": 0.001}]
    acc = {"taken": 41, "trained": 16, "dropped": {"unstarted_at_shutdown": 25}, "failed": {}, "dropped_total": 25,
           "failed_total": 0, "balanced": True}
    text = str(Summary(run_dir="r", steps=2, param_version=2, accuracy_before=0.5, accuracy_after=0.5,
                       accounting=acc, wall_s=3.0, evals=evals, lag_counts={0: 5}))
    # a mean of per-sample counts says "per sample"; a rate is named as one; seconds are not learning
    assert "tool_calls per sample: before 0.750 -> after 0.800" in text and "timeout" not in text
    assert "tool_call_success_rate: before 0.500 -> after 0.750" in text and "tool_s" not in text
    assert "(1 other eval/tool_* metrics: 0 before and after)" in text
    assert "*_at_shutdown: prompts the rollouter had taken ahead of the trainer" in text
    assert "trained tokens by version lag: lag 0: 5 (bound: lag <= 0)" in text
    # the well-formed rate is shown even when it is 0 before and after (it is what word_problems is about)
    evals = [{**e, "eval/format": 0.0} for e in evals]
    text = str(Summary(run_dir="r", steps=2, param_version=2, accuracy_before=0.5, accuracy_after=0.5,
                       accounting=acc, wall_s=3.0, evals=evals, lag_counts={0: 5, 1: 3}, staleness_bound=2))
    assert "format: before 0.000 -> after 0.000" in text and "(1 other eval/tool_* metrics" in text
    assert "lag 0: 5, lag 1: 3 (bound: lag <= 2)" in text
    # the "after" figure says what it averages, as the finished dashboard's header does
    assert "after 50.0%\n" in text  # unknown (summaries written before the field): nothing said
    for n, said in ((1, "(final evaluation)"), (3, "(mean of the last 3 evaluations)")):
        text = str(Summary(run_dir="r", steps=2, param_version=2, accuracy_before=0.5, accuracy_after=0.5,
                           accounting=acc, wall_s=3.0, evals=evals, accuracy_after_evals=n))
        assert f"after 50.0% {said}\n" in text


def test_run_summary_sets_the_responses_dropped_stale_beside_the_trained_ones():
    """Session 20: at staleness 1 the long-tail run dropped 17-36 groups a run as stale, each 4-7x an average group's
    tokens: the bound cuts the long tail. The summary now says so, from the trainer's counts by length."""
    from asyncrl.summary import Summary

    acc = {"taken": 40, "trained": 32, "dropped": {"stale_at_trainer": 3}, "failed": {}, "dropped_total": 3,
           "failed_total": 0, "balanced": True}
    kw = dict(run_dir="r", steps=2, param_version=2, accuracy_before=None, accuracy_after=None, accounting=acc,
              wall_s=3.0, staleness_bound=2)
    # trained: 100 rows of 10 + 50 of 30 = mean 16.7; dropped: 4 of 300 + 20 of 20 = 1,600 / 24 = 66.7 (4.0x)
    s = Summary(**kw, response_length_counts={"10": 100, "30": 50}, stale_length_counts={"300": 4, "20": 20})
    assert ("  3 groups dropped stale at the trainer: 24 responses, mean 67 tokens (longest 300) against a mean of 17 "
            "tokens trained (4.0x); the longest responses outlive the staleness bound (lag <= 2) and train less than their share "
            "(README: 'The staleness bound and the long tail')\n") in str(s)
    # 1.2x: the numbers, no claim about the tail
    s = Summary(**kw, response_length_counts={10: 10}, stale_length_counts={12: 8})
    assert s.stale_line() == ("3 groups dropped stale at the trainer: 8 responses, mean 12 tokens (longest 12) against a mean "
                             "of 10 tokens trained (1.2x)")
    assert Summary(**kw, response_length_counts={10: 10}).stale_line() == ""  # nothing dropped: no line
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "### The staleness bound and the long tail" in readme  # where the line sends the reader
    assert "dropped stale at the trainer" not in str(Summary(**kw, response_length_counts={10: 10}))


def test_notebook_kernels_get_no_transformers_progress_bars():
    """A bar written from an engine's loading thread lands in whatever cell runs then (04's table cell)."""
    import transformers.utils.logging as hf_logging

    from asyncrl.notebook import _quiet_library_progress_bars

    hf_logging.enable_progress_bar()
    try:
        _quiet_library_progress_bars()
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def _summary(**kw):
    from asyncrl.summary import Summary

    base = dict(run_dir="r", steps=3, param_version=2, accuracy_before=None, accuracy_after=None, accounting={},
                wall_s=31.4, stop_reason="trainer.total_training_steps=3 reached")
    return Summary(**{**base, **kw})


def test_run_end_text_says_done_with_steps_version_and_time_or_the_failure():
    from asyncrl.notebook_progress import run_end_text

    assert run_end_text("mode_b", _summary(), 20.2) == (
        "mode_b done: 3 steps, final version v2, in 31 s (actors up in 20 s)", True)
    text, ok = run_end_text("mode_b", _summary(stop_reason="trainer error at step 2: boom"), 9)
    assert not ok and text == "mode_b failed after 31 s: trainer error at step 2: boom (actors up in 9 s)"
    text, ok = run_end_text("m", _summary(stop_reason="time budget trainer.total_time_s=5 reached"), 1)
    assert ok and "(time budget trainer.total_time_s=5 reached)" in text
    assert run_end_text("m", None, 4) == ("m stopped before its end (actors up in 4 s)", False)


def test_a_run_line_reads_done_when_the_run_ends_whoever_waits_for_it(caplog):
    """The start line of ``nb.start`` is rewritten once ``exp.summary`` appears (00 and 02 wait with
    ``exp.wait_async()`` themselves), and a run stopped without a summary says so."""
    from asyncrl.notebook_progress import RunLine

    caplog.set_level("INFO", logger="asyncrl.notebook")

    class Exp:
        name, summary, trainer, rollouter = "mode_a", None, object(), object()

    async def main():
        exp = Exp()
        line = RunLine(exp, Progress("starting"), up_s=20, poll_s=0.01).watch()
        await asyncio.sleep(0.05)
        assert line.final is None  # still running
        exp.summary = _summary(steps=4, param_version=4)
        await asyncio.sleep(0.05)
        stopped = Exp()
        stopped.trainer = stopped.rollouter = None
        return line.final, RunLine(stopped, Progress("s"), 3).settle()

    done, stopped = asyncio.run(main())
    assert done == "mode_a done: 4 steps, final version v4, in 31 s (actors up in 20 s)"
    assert stopped == "mode_a stopped before its end (actors up in 3 s)"
    assert [r.getMessage() for r in caplog.records] == [done, stopped]


def test_status_elapsed_stops_at_the_summarys_wall_time():
    """A dashboard's last poll comes after finish(): its header's seconds are the summary's (the status
    line's and the notebook table's run s), not the moment of that poll."""
    import time

    from asyncrl.experiment import Experiment
    from asyncrl.message_queue import QueueStats
    from asyncrl.recipes import smoke_cpu
    from asyncrl.summary import Summary

    exp = Experiment(smoke_cpu("a"))
    exp.t_start = time.time() - 30.0
    tr, mq = {"done": True}, QueueStats(0, 0, 0, 0, 0, {}, 0, 0, False)
    assert exp._status({}, tr, mq)["elapsed_s"] >= 30.0  # running, or done but not yet summarised: the clock
    exp.summary = Summary(run_dir="", steps=3, param_version=3, accuracy_before=None, accuracy_after=None,
                          accounting={}, wall_s=21.46)
    assert exp._status({}, tr, mq)["elapsed_s"] == 21.46


def test_an_experiment_refuses_what_is_not_a_config_and_calls_before_start():
    """Session 30's fresh user: ``Experiment({...})`` / ``Experiment(arith_grpo_cpu)`` raised AttributeError deep in
    validate, ``Experiment({})`` ran the default config, ``replicas="abc"`` set num_replicas=3; before start(),
    wait() started a local Ray and failed inside it, finish() / interrupt() / accounting() raised AttributeError."""
    from asyncrl.experiment import Experiment
    from asyncrl.recipes import arith_grpo_cpu

    for bad, says in (({"trainer": {}}, "got a dict"), ({}, "got a dict"), ("x.yaml", "got a str"),
                      (arith_grpo_cpu, "got a recipe function: call it")):
        with pytest.raises(TypeError, match=f"expected an ExperimentConfig, {says}"):
            Experiment(bad)
    for bad in ("abc", [1]):
        with pytest.raises(TypeError, match="expected a list of running RolloutReplica objects"):
            Experiment(arith_grpo_cpu(), replicas=bad)
    exp = Experiment(arith_grpo_cpu())
    assert exp.status() == {"state": "not started"}
    for call in (lambda: exp.wait(progress=False), exp.finish, exp.interrupt, exp.accounting,
                 lambda: asyncio.run(exp.wait_async())):
        with pytest.raises(RuntimeError, match=r"Experiment\.\w+\(\) before start\(\): call exp.start\(\) first"):
            call()
    exp.config.actor_rollout_ref.rollout.n = 0  # changed after the constructor's check: start() checks again
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.n"):
        exp.start()


def test_a_closed_session_starts_nothing_and_start_ray_checks_its_arguments():
    """Session 30's fresh user: after ``nb.close()``, ``nb.run(cfg)`` started a new Ray and a whole run the session no
    longer tracked; ``nb.replica(dict)`` raised AttributeError; ``start_ray(name=None)`` a TypeError from os.path.join
    and ``num_cpus=-1`` Ray's own ValueError after its start-up began."""
    from asyncrl.notebook import start_ray
    from asyncrl.recipes import arith_grpo_cpu

    nb = NotebookSession("t")
    with pytest.raises(TypeError, match="replica\\(cfg\\): expected an ExperimentConfig, got a dict"):
        asyncio.run(nb.replica({"trainer": {}}))
    nb.close()
    for call in (lambda: nb.run(arith_grpo_cpu()), lambda: nb.replica(arith_grpo_cpu())):
        with pytest.raises(RuntimeError, match=r"this session is closed \(nb.close\(\) ran"):
            asyncio.run(call())
    with pytest.raises(ValueError, match=r"start_ray\(name=...\): a non-empty notebook name .* got None"):
        start_ray(name=None)
    with pytest.raises(ValueError, match=r"start_ray\(num_cpus=...\): a whole number >= 1 .* got -1"):
        start_ray(name="t", num_cpus=-1)


def test_the_summary_says_how_many_held_out_samples_each_figure_covers_and_why_prompts_failed():
    """Session 31's fresh user: 12 of 16 held-out samples failed and the summary read "before 100.0%" (the mean of the
    4 scored); all 16 failed read 0.0%; a custom reward without ``acc`` was called an accuracy; ``failed 130`` came
    with no reasons (only summary.json had them)."""
    from asyncrl.summary import Summary, held_out

    def ev(version, acc, n, failed, of="rule"):
        return {"version": version, "accuracy": acc, "n": n, "rows": n + failed, "accuracy_of": of,
                "eval/failed": failed, "eval/failed_reasons": {"ValueError": failed} if failed else {}}

    acc = {"taken": 140, "trained": 8, "dropped": {}, "failed": {"ValueError": 130, "trainer_error: KeyError": 2},
           "dropped_total": 0, "failed_total": 132, "balanced": True}

    def text(evals, k=1, none=""):
        h = held_out(evals, k, none)
        s = Summary(run_dir="r", steps=2, param_version=2, accuracy_before=(h.get("before") or {}).get("value"),
                    accuracy_after=(h.get("after") or {}).get("value"), accounting=acc, wall_s=3.0, evals=evals,
                    accuracy_after_evals=(h.get("after") or {}).get("evals", 0), held_out=h)
        return str(s).splitlines()[1].strip(), s

    line, s = text([ev(0, 1.0, 4, 12), ev(2, 0.375, 16, 0)])
    assert line == ("held-out greedy accuracy: before 100.0% over 4 scored of 16 (12 failed: not in the mean) -> after 37.5% of 16 "
                    "(final evaluation)"), line
    assert "  failed by reason: ValueError 130, trainer_error: KeyError 2 (each kind's first traceback is in the log)" \
        in str(s).splitlines()
    line, s = text([ev(0, 0.0, 0, 16), ev(2, 0.0, 0, 16)])
    assert line == "held-out greedy accuracy: before n/a: all 16 failed -> after n/a: all 16 failed", line
    assert s.accuracy_before is None and s.accuracy_after is None and s.accuracy_after_evals == 0
    # the mean of the last 3: an evaluation whose every sample failed is left out, not averaged in as 0
    line, s = text([ev(0, 0.5, 16, 0), ev(1, 0.5, 14, 2), ev(2, 0.0, 0, 16), ev(3, 0.7, 16, 0)], k=3)
    assert s.accuracy_after == pytest.approx(0.6) and s.accuracy_after_evals == 2
    assert line.endswith("-> after 60.0% of 16 (mean of the last 2 evaluations; 18 failed over them: not in the mean; "
                         "1 more evaluation(s) had every sample failed: left out)"), line
    # a custom reward with no acc extra: its mean score, not an accuracy
    line, _ = text([ev(0, 0.25, 16, 0, "score"), ev(2, 0.5, 16, 0, "score")])
    assert line == ("held-out greedy mean score (the reward gives no 'acc': not an accuracy): before 0.250 of 16 -> "
                    "after 0.500 of 16 (final evaluation)"), line
    line, s = text([], none="data.val_files unset: no held-out evaluation (set data.val_files=... to evaluate "
                            "held-out rows)")
    assert line == ("held-out: data.val_files unset: no held-out evaluation (set data.val_files=... to evaluate "
                    "held-out rows)"), line
    assert s.accuracy_before is None and s.accuracy_after is None
    import dataclasses
    import json

    keys = json.loads(json.dumps(dataclasses.asdict(s)))  # summary.json: the old keys stay, held_out is added
    assert {"accuracy_before", "accuracy_after", "accuracy_after_evals", "held_out", "accounting"} <= set(keys)
