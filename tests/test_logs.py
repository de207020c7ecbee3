"""One log format in the driver and every Ray actor (the level word and the logger's name), and a terminal progress
bar that actor and log lines print above, never glued onto (session 32's newcomer: actor lines had no level word and
began at the end of the bar's line)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from tqdm.auto import tqdm

from asyncrl.logs import LOG_FORMAT, LEVEL_ENV, SETUP_HOOK
from asyncrl.progress import progress_bar

REPO = Path(__file__).resolve().parent.parent


class Terminal:
    """A fake terminal that ``sys.stdout`` and ``sys.stderr`` both write to, as a shell shows them: ``screen()``
    renders ``\\r`` (back to the line's start, overwriting) and ``\\n``."""

    def __init__(self):
        self.raw = []

    def stream(self, name: str):
        terminal = self

        class Stream:
            def write(self, text):
                terminal.raw.append(text)
                return len(text)

            def flush(self):
                pass

            def isatty(self):
                return True

            def __repr__(self):
                return f"<fake {name}>"
        return Stream()

    def screen(self) -> list[str]:
        lines, line, col = [], [], 0
        for ch in "".join(self.raw):
            if ch == "\n":
                lines.append("".join(line).rstrip())
                line, col = [], 0
            elif ch == "\r":
                col = 0
            else:
                line[col:col + 1] = [ch]
                col += 1
        return lines + (["".join(line).rstrip()] if line else [])


@pytest.fixture
def terminal(monkeypatch):
    """A :class:`Terminal` as ``sys.stdout`` and ``sys.stderr`` for the test's body (pytest sets its capture streams
    at each phase's start: patched in the first write of the test, through ``use``)."""
    term = Terminal()
    term.use = lambda: (monkeypatch.setattr(sys, "stdout", term.stream("stdout")),
                        monkeypatch.setattr(sys, "stderr", term.stream("stderr")))
    return term


def _actor_lines():
    """What Ray's driver does with an actor's output: ``print(line, file=sys.stderr)`` (or stdout), from its log
    thread, the stream looked up at the call."""
    print("(FullyAsyncTrainer pid=11) 2026-12-01 12:00:00,001 WARNING asyncrl.trainer: from stderr", file=sys.stderr)
    print("(FullyAsyncRollouter pid=12) from stdout", file=sys.stdout)


def test_without_the_redirect_an_actor_line_glues_onto_the_bar(terminal):
    """The bug, on the fake terminal: a plain tqdm bar, then Ray's print."""
    terminal.use()
    bar = tqdm(total=4, desc="run", file=sys.stderr)
    bar.update(1)
    bar.refresh()
    _actor_lines()
    bar.close()
    glued = [line for line in terminal.screen() if "from stderr" in line]
    assert glued and glued[0].startswith("run:"), terminal.screen()


def test_actor_and_log_lines_print_above_the_bar(terminal):
    terminal.use()
    handler = logging.StreamHandler(sys.stderr)  # the CLI's console handler (basicConfig) on the terminal
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.root.addHandler(handler)
    try:
        with progress_bar("my_rows_grpo_cpu__0__20261201-120000", 4) as bar:
            assert type(sys.stdout).__name__ == type(sys.stderr).__name__ == "AboveTheBar"
            bar.update(1)
            bar.refresh()
            log_thread = threading.Thread(target=_actor_lines)  # Ray prints from its log thread
            log_thread.start()
            log_thread.join()
            logging.getLogger("asyncrl.experiment").warning("from the driver")
            print("partial", end="", file=sys.stdout)  # a line is written once whole
            bar.update(1)
            bar.refresh()
            print(" line", file=sys.stdout)
        assert [h for h in logging.root.handlers if h is handler], "the console handler is put back"
    finally:
        logging.root.removeHandler(handler)
    assert type(sys.stdout).__name__ == "Stream" and type(sys.stderr).__name__ == "Stream"  # restored
    screen = terminal.screen()
    assert "(FullyAsyncTrainer pid=11) 2026-12-01 12:00:00,001 WARNING asyncrl.trainer: from stderr" in screen, screen
    assert "(FullyAsyncRollouter pid=12) from stdout" in screen, screen
    assert any(line.endswith(" WARNING asyncrl.experiment: from the driver") and "%|" not in line for line in screen)
    assert "partial line" in screen, screen
    assert screen[-1].startswith("my_rows_grpo_cpu__0__20261201-120000:  50%|"), screen  # the bar, last and whole


def test_a_hidden_bar_redirects_nothing(terminal):
    terminal.use()
    before = sys.stdout, sys.stderr
    with progress_bar("run", 4, show=False) as bar:
        assert (sys.stdout, sys.stderr) == before
        bar.update(1)
    assert terminal.screen() == []


def _run(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_the_worker_setup_hook_logs_with_the_level_word_at_the_drivers_level():
    """What Ray runs first in each worker process of a run (a process of its own here: it sets the root logger)."""
    out = _run("""
        import logging
        from asyncrl.logs import setup_worker_logging
        setup_worker_logging()
        logging.getLogger("asyncrl.rollouter").info("an info line")
        logging.getLogger("asyncrl.rollouter").debug("not shown")
        logging.getLogger("httpx").info("another library's INFO: not shown")
        logging.getLogger("vllm.x").warning("another library's warning")
    """, {LEVEL_ENV: "20"})
    lines = out.stderr.splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "INFO asyncrl.rollouter: an info line", "WARNING vllm.x: another library's warning"], out.stderr


def test_init_ray_gives_every_worker_the_hook_and_the_drivers_level(monkeypatch):
    import ray

    from asyncrl.ray_start import init_ray

    seen = {}
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    monkeypatch.setattr(logging.getLogger("asyncrl"), "level", logging.INFO)
    init_ray(None, 1)
    assert seen["runtime_env"] == {"worker_process_setup_hook": SETUP_HOOK,
                                   "env_vars": {"TOKENIZERS_PARALLELISM": "false", LEVEL_ENV: "20"}}


@pytest.mark.e2e
def test_a_real_ray_actors_log_line_has_the_level_word_and_the_logger_name():
    """A Ray started by init_ray (as Experiment.start starts it), an actor that logs: the driver prints the actor's
    line in the driver's format, and INFO passes at the driver's INFO (before: the bare message, INFO dropped)."""
    out = _run("""
        import logging, time
        import ray
        from asyncrl.ray_start import init_ray
        logging.basicConfig(level=logging.INFO)
        init_ray(None, 1)

        @ray.remote(num_cpus=0)
        class Probe:
            def log(self):
                logging.getLogger("asyncrl.rollouter").warning("a warning from an actor")
                logging.getLogger("asyncrl.rollouter").info("an info from an actor")
                return True

        ray.get(Probe.remote().log.remote())
        time.sleep(3)  # Ray's log monitor forwards the actor's lines
        ray.shutdown()
    """, {"RAY_COLOR_PREFIX": "0"}, timeout=300)
    lines = (out.stdout + out.stderr).splitlines()
    for level, text in (("WARNING", "a warning from an actor"), ("INFO", "an info from an actor")):
        assert any(line.startswith("(Probe pid=") and line.endswith(f" {level} asyncrl.rollouter: {text}")
                   for line in lines), out.stdout + out.stderr


def test_the_bar_draws_a_steps_reward_beside_its_count_and_an_evaluation_between_steps():
    """A fresh user's pass (session 32): ``1/2 ... reward=0.00`` while step 1's log line said 0.5156 (the count was
    drawn before the values), and the bar's acc= kept step 0's evaluation until another step came."""
    import io

    from tqdm import tqdm

    from asyncrl.progress import draw_progress

    out = io.StringIO()
    bar = tqdm(total=2, desc="run", file=out, mininterval=0, ascii=True)
    step0 = {"step": 0, "reward/mean": 0.0}  # the trainer counts step 1 (global_steps) before its sync and its row
    done = draw_progress(bar, {"global_steps": 1, "history": [step0]}, [{"accuracy": 0.35}], 0)
    last = out.getvalue().split("\r")[-1]
    assert done == 0 and "0/2" in last and "reward=0.00" in last, last  # was: 1/2 beside step 0's reward
    step1 = {"step": 1, "reward/mean": 0.5156, "staleness/lag_max": 1}
    done = draw_progress(bar, {"global_steps": 1, "history": [step0, step1]}, [{"accuracy": 0.35}], done)
    last = out.getvalue().split("\r")[-1]
    assert done == 1 and "1/2" in last and "reward=0.52" in last and "acc=0.35" in last, last
    draw_progress(bar, {"global_steps": 1, "history": [step0, step1]}, [{"accuracy": 0.35}, {"accuracy": 0.5}], 1)
    assert "acc=0.50" in out.getvalue().split("\r")[-1]  # no new step, a new evaluation: drawn
    bar.close()
