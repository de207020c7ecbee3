"""Ctrl-C on ``asyncrl train`` gave a raw KeyboardInterrupt traceback from ``ray.wait``, no summary and an empty
metrics.csv. Now :meth:`Experiment.wait` stops the run as a normal end (the trainer finishes its step, the queue shuts
down, :meth:`Experiment.finish` writes the artifacts) and the CLI prints the summary, one line and exits 130. Fakes for
Ray and the actors; the real stack's stop is the end-to-end tests'."""

import types

import pytest

from asyncrl.cli import main
from asyncrl.experiment import Experiment, RunInterrupted
from asyncrl.summary import Summary


def _summary(run_dir, **kw) -> Summary:
    base = dict(run_dir=str(run_dir), steps=3, param_version=3, accuracy_before=0.1, accuracy_after=0.2,
                accounting={"taken": 10, "trained": 8, "dropped_total": 2, "failed_total": 0, "balanced": True},
                wall_s=12.0, stop_reason="interrupted by the user (Ctrl-C) at step 3")
    base.update(kw)
    return Summary(**base)


def _write_run_dir(run_dir, names=("config.yaml", "eval.csv", "metrics.csv", "plot.png", "summary.json")):
    for name in names:
        (run_dir / name).write_text("")
    (run_dir / "checkpoints" / "global_step_3").mkdir(parents=True)


def test_the_cli_prints_the_summary_and_one_line_and_exits_130(capsys, tmp_path, monkeypatch):
    def interrupted_run(self, **_):
        _write_run_dir(tmp_path)
        raise RunInterrupted(_summary(tmp_path, last_checkpoint=f"{tmp_path}/checkpoints/global_step_3"))

    monkeypatch.setattr(Experiment, "run", interrupted_run)
    assert main(["train", "trainer.total_training_steps=3"]) == 130
    out, err = capsys.readouterr()
    assert "3 steps" in out and "(stopped: interrupted by the user (Ctrl-C) at step 3)" in out
    assert err.strip().splitlines() == [
        f"interrupted by the user (Ctrl-C) at step 3; saved {tmp_path}/ (config.yaml, eval.csv, metrics.csv, "
        f"plot.png, summary.json), checkpoint {tmp_path}/checkpoints/global_step_3"]


@pytest.mark.parametrize("interrupted", [True, False])
def test_the_saved_line_lists_what_the_run_directory_holds(capsys, tmp_path, monkeypatch, interrupted):
    """The Ctrl-C line was a fixed list that left plot.png out: both end lines list the files written (a folder such
    as tensorboard/ with a slash; checkpoints/ is named by the checkpoint), and nothing the run did not write."""
    def run(self, **_):
        _write_run_dir(tmp_path, ("metrics.csv", "summary.json", "plot.png"))
        (tmp_path / "tensorboard").mkdir()
        if interrupted:
            raise RunInterrupted(_summary(tmp_path))
        return _summary(tmp_path, stop_reason="")

    monkeypatch.setattr(Experiment, "run", run)
    assert main(["train", "trainer.total_training_steps=3"]) == (130 if interrupted else 0)
    out, err = capsys.readouterr()
    listing = f"{tmp_path}/ (metrics.csv, plot.png, summary.json, tensorboard/)"
    if interrupted:
        assert err.strip() == f"interrupted by the user (Ctrl-C) at step 3; saved {listing}", err
    else:
        assert out.strip().splitlines()[-1] == f"artifacts: {listing}", out


def test_a_second_ctrl_c_aborts_with_one_line(capsys, monkeypatch):
    def aborted_run(self, **_):
        raise KeyboardInterrupt

    monkeypatch.setattr(Experiment, "run", aborted_run)
    assert main(["train", "trainer.total_training_steps=3"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interrupted: aborted; ") and "Traceback" not in err[0], err


class _Remote:
    def __init__(self, fn):
        self.remote = fn


def test_wait_turns_ctrl_c_into_a_clean_stop(tmp_path, monkeypatch):
    calls = []

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("asyncrl.experiment.ray", types.SimpleNamespace(wait=ctrl_c, get=lambda x, **k: x))
    exp = Experiment.__new__(Experiment)
    exp._phase = "started"  # a started run (Experiment.start not called: fakes stand in for its actors)
    exp.config, exp.name, exp._fit_ref = types.SimpleNamespace(trainer=types.SimpleNamespace(
        progress_bar=False, total_training_steps=5)), "run", object()
    exp.trainer = types.SimpleNamespace(request_stop=_Remote(lambda reason: calls.append(("request_stop", reason))))
    exp.mq = types.SimpleNamespace(shutdown=lambda: calls.append(("mq.shutdown",)))
    monkeypatch.setattr(Experiment, "_finish_or_raise", lambda self: calls.append(("finish",)) or _summary(tmp_path))
    with pytest.raises(RunInterrupted) as info:
        exp.wait()
    assert isinstance(info.value, KeyboardInterrupt)  # code that does not know it still stops
    assert calls == [("request_stop", "interrupted by the user (Ctrl-C)"), ("mq.shutdown",), ("finish",)]
    assert info.value.summary.stop_reason == "interrupted by the user (Ctrl-C) at step 3"


def _in_c_while(signals: int):
    """Stands in for ``ray.wait``'s C call: the main thread blocks in C (a pthread mutex: no bytecode runs, so Python's
    signal handler waits) while another thread sends it ``signals`` SIGINTs, then returns."""
    import ctypes
    import signal
    import threading
    import time

    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER (glibc)
    locked = threading.Event()
    main = threading.main_thread().ident

    def sender():
        libc.pthread_mutex_lock(mutex)
        locked.set()
        time.sleep(0.2)  # the main thread is in pthread_mutex_lock now
        for _ in range(signals):
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.05)
        libc.pthread_mutex_unlock(mutex)

    def wait(*a, **k):
        threading.Thread(target=sender, daemon=True).start()
        locked.wait()
        libc.pthread_mutex_lock(mutex)  # returns once sender() unlocks it; the handler runs right after
        libc.pthread_mutex_unlock(mutex)
        return [], []
    return wait


def _waiting_experiment(tmp_path, wait, calls, request_stop=None):
    """An Experiment whose ``ray.wait`` is ``wait`` (patched for good: it runs in a child process of its own)."""
    import asyncrl.experiment

    asyncrl.experiment.ray = types.SimpleNamespace(wait=wait, get=lambda x, **k: x)
    exp = Experiment.__new__(Experiment)
    exp._phase = "started"  # a started run (Experiment.start not called: fakes stand in for its actors)
    exp.config, exp.name, exp._fit_ref = types.SimpleNamespace(trainer=types.SimpleNamespace(
        progress_bar=False, total_training_steps=5)), "run", object()
    exp.trainer = types.SimpleNamespace(
        request_stop=_Remote(request_stop or (lambda reason: calls.append(("request_stop", reason)))),
        status=_Remote(lambda: {"global_steps": 0, "history": []}))
    exp.rollouter = types.SimpleNamespace(snapshot=_Remote(lambda: {"eval_history": []}))
    exp.mq = types.SimpleNamespace(shutdown=lambda: calls.append(("mq.shutdown",)))
    Experiment._finish_or_raise = lambda self: calls.append(("finish",)) or _summary(tmp_path)
    return exp


def _in_child(scenario: str, tmp_path) -> None:
    """Run ``scenario(tmp_path)`` of this module in a fresh interpreter with Python's own SIGINT handler, at most 60 s:
    the pytest process may have SIGINT ignored (below) and its signal state is not this test's to change; a hang
    fails this test alone."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")]))
    # a terminal's SIGINT handler: a shell starts a background job (`cmd &`, CI runners, nohup) with SIGINT ignored, and
    # Python then leaves it ignored (the suite's background run of 2026-12-05: the sent signals vanished, the fake
    # ray.wait was called forever and pytest-timeout's thread method ended the whole suite)
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"import {Path(__file__).stem} as m; m.{scenario}({str(tmp_path)!r})")
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{scenario} hung for 60 s: {e.stderr}")
    assert done.returncode == 0, done.stderr


def _wait_raises(exp) -> KeyboardInterrupt:
    """The KeyboardInterrupt ``exp.wait()`` raised (an AssertionError when it returned)."""
    try:
        exp.wait()
    except KeyboardInterrupt as e:
        return e
    raise AssertionError("exp.wait() returned")


def _two_ctrl_c_that_come_together(tmp_path):
    import signal
    from pathlib import Path

    calls = []
    e = _wait_raises(_waiting_experiment(Path(tmp_path), _in_c_while(2), calls))
    assert not isinstance(e, RunInterrupted) and calls == [], calls  # aborted: no gentle stop began
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler and wakeup fd are back
    assert signal.set_wakeup_fd(-1) == -1


def test_two_ctrl_c_that_come_together_abort(tmp_path):
    """Two Ctrl-C within the second the main thread spends in ray.wait's C code were one to Python's handler: the run
    stopped gently (and the warning said "Ctrl-C again aborts"). Counted, the second aborts as it does later."""
    _in_child("_two_ctrl_c_that_come_together", tmp_path)


def _one_ctrl_c_then_another(tmp_path):
    import signal
    from pathlib import Path

    calls = []
    assert isinstance(_wait_raises(_waiting_experiment(Path(tmp_path), _in_c_while(1), calls)), RunInterrupted)
    assert calls == [("request_stop", "interrupted by the user (Ctrl-C)"), ("mq.shutdown",), ("finish",)], calls

    def second_ctrl_c(reason):  # while the gentle stop runs
        calls.append(("request_stop", reason))
        signal.raise_signal(signal.SIGINT)

    calls.clear()
    e = _wait_raises(_waiting_experiment(Path(tmp_path), _in_c_while(1), calls, second_ctrl_c))
    assert not isinstance(e, RunInterrupted) and calls == [("request_stop", "interrupted by the user (Ctrl-C)")]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_one_real_ctrl_c_still_stops_gently_and_one_more_aborts(tmp_path):
    _in_child("_one_ctrl_c_then_another", tmp_path)


def test_an_aborted_run_stops_its_rollouter_loops_before_releasing_their_workers(monkeypatch):
    """After a second Ctrl-C, stop() released the agent-loop workers while the rollouter's loops still launched
    samples: they failed with "ValueError: min() arg is an empty sequence" tracebacks on the way out."""
    calls = []
    monkeypatch.setattr("asyncrl.experiment.ray", types.SimpleNamespace(get=lambda x, **k: x, kill=lambda h: None,
                                                                        is_initialized=lambda: False))
    exp = Experiment.__new__(Experiment)
    exp._phase = "started"  # a started run (Experiment.start not called: fakes stand in for its actors)
    exp.rollouter = types.SimpleNamespace(stop=_Remote(lambda: calls.append("rollouter.stop")),
                                          shutdown=_Remote(lambda: calls.append("rollouter.shutdown")))
    exp.trainer = exp.mq = exp.lb = exp.placement = None
    exp._external_replicas, exp._replica_objs, exp._started_ray = None, [], False
    exp.stop()
    assert calls == ["rollouter.stop", "rollouter.shutdown"]
