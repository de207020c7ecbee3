"""Harbor task format + LocalSandbox (bubblewrap): rewards from verifiers, isolation, limits, cleanup."""

from __future__ import annotations

import asyncio
import os
import json
import shutil
import socket
import time
from pathlib import Path

import pytest

from asyncrl.agent_loop.sandbox import isolation
from asyncrl.agent_loop.sandbox.dockerfile import DockerfileError, plan_build
from asyncrl.agent_loop.sandbox.env import LocalSandbox, SandboxLimits, SandboxStartError, SandboxUnavailableError
from asyncrl.agent_loop.sandbox.env import start_sandbox
from asyncrl.agent_loop.sandbox.task import (EXAMPLES_DIR, TaskFormatError, example_rows, list_tasks, load_task,
                                             read_verifier_result)

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap not installed (apt-get install bubblewrap)")
TASKS = list_tasks()
PERSISTENT = pytest.mark.parametrize("persistent", [False, True], ids=["per-command", "container"])


def run(coro):
    return asyncio.run(coro)


async def _verify(sb: LocalSandbox, task) -> float | None:
    await sb.upload(task.tests_dir, "/tests")
    await sb.exec("bash /tests/test.sh", timeout_sec=task.config.verifier_timeout_sec)
    res = read_verifier_result(sb.host_path("/logs/verifier"))
    return None if res is None else res.reward


# ------------------------------------------------------------------------------------------ task format
def test_examples_are_valid_harbor_tasks():
    assert 3 <= len(TASKS) <= 5
    for t in TASKS:
        assert t.has_solution and t.instruction.strip()
        assert (t.environment_dir / "Dockerfile").is_file()
        assert t.config.agent_timeout_sec > 0 and t.config.verifier_timeout_sec > 0


def test_task_toml_timeouts_and_sizes(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text("true\n")
    (tmp_path / "instruction.md").write_text("do it")
    (tmp_path / "task.toml").write_text('schema_version = "1.1"\n[task]\nname = "org/x"\n[agent]\ntimeout_sec = 7\n'
                                        '[verifier]\ntimeout_sec = 3.5\nenv = { A = "1" }\n'
                                        '[environment]\nmemory = "1G"\nallow_internet = true\n')
    t = load_task(tmp_path)
    assert (t.name, t.config.agent_timeout_sec, t.config.verifier_timeout_sec) == ("org/x", 7.0, 3.5)
    assert t.config.memory_mb == 1024 and t.config.allow_internet and t.config.verifier_env == {"A": "1"}


def test_missing_test_sh_is_a_format_error(tmp_path):
    (tmp_path / "task.toml").write_text("")
    (tmp_path / "instruction.md").write_text("x")
    with pytest.raises(TaskFormatError, match="tests/test.sh"):
        load_task(tmp_path)


def test_reward_txt_json_and_missing(tmp_path):
    assert read_verifier_result(tmp_path) is None
    (tmp_path / "reward.json").write_text(json.dumps({"passed": 1, "style": 0}))
    assert read_verifier_result(tmp_path).reward == 0.5
    (tmp_path / "reward.txt").write_text("1\n")
    assert read_verifier_result(tmp_path).rewards == {"reward": 1.0}
    (tmp_path / "reward.txt").write_text("not a number")
    assert read_verifier_result(tmp_path) is None


def test_example_rows_route_to_swe_agent():
    rows = example_rows(6, seed=1)
    assert len(rows) == 6 and all(r["agent_name"] == "swe_agent" for r in rows)
    assert {r["extra_info"]["task_dir"] for r in rows} == {str(t.path) for t in TASKS}
    assert Path(rows[0]["extra_info"]["task_dir"]).parent == EXAMPLES_DIR


def test_dockerfile_plan():
    plan = plan_build("FROM python:3.11-slim\nWORKDIR /app\nCOPY src/ ./src/\nENV A=1 B=two\n"
                      "RUN echo hi \\\n  && true\nCMD [\"bash\"]\n")
    assert plan.workdir == "/app" and plan.env == {"A": "1", "B": "two"}
    assert plan.steps == [("copy", "src/", "/app/src/"), ("run", "echo hi && true", "/app")]
    with pytest.raises(DockerfileError):
        plan_build("COPY --from=builder /x /y\n")


# ------------------------------------------------------------------------------------------ sandbox
@needs_bwrap
@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_oracle_solution_scores_one_and_doing_nothing_scores_zero(task, tmp_path):
    async def trial(oracle: bool) -> float | None:
        async with await start_sandbox(task.environment_dir, tmp_path / f"trial-{oracle}", persistent=oracle) as sb:
            if oracle:
                await sb.upload(task.solution_dir, "/solution")
                assert (await sb.exec("bash /solution/solve.sh")).return_code == 0
            return await _verify(sb, task)

    assert run(trial(True)) == 1.0
    assert run(trial(False)) < 1.0
    if task.name != "fix-word-count":  # that verifier gives partial credit
        assert run(trial(False)) == 0.0
    assert not (tmp_path / "trial-True").exists(), "trial dir must be removed on exit"


@needs_bwrap
@PERSISTENT
def test_sandbox_cannot_read_outside_its_trial_dir(tmp_path, persistent):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")

    async def go():
        async with await start_sandbox(None, tmp_path / "trial", persistent=persistent) as sb:
            own = await sb.exec("echo mine > note.txt && cat /app/note.txt")
            other = await sb.exec(f"cat {secret}; ls {tmp_path}; cat /etc/shadow; ls /work /home")
            return own, other

    own, other = run(go())
    assert own.stdout.strip() == "mine"
    assert "top secret" not in other.stdout and other.return_code != 0
    assert "No such file" in other.stderr


@needs_bwrap
@PERSISTENT
def test_sandbox_has_no_network(tmp_path, persistent):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]  # listening: the kernel would complete a connection without accept()
    probe = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); "
             "print('CONNECTED')\"")

    async def go():
        async with await start_sandbox(None, tmp_path / "trial", persistent=persistent) as sb:
            return await sb.exec(probe)

    res = run(go())
    server.close()
    assert "CONNECTED" not in res.stdout and res.return_code != 0
    assert "Connection refused" in res.stderr or "unreachable" in res.stderr


@needs_bwrap
@PERSISTENT
def test_timeout_kills_the_whole_namespace_and_limits_apply(tmp_path, persistent):
    async def go():
        limits = SandboxLimits(memory_mb=256, max_output_bytes=1000)
        async with await start_sandbox(None, tmp_path / "trial", limits=limits, persistent=persistent) as sb:
            slow = await sb.exec("(sleep 30 &) ; sleep 30", timeout_sec=0.5)
            big = await sb.exec("python3 -c \"x = bytearray(512 * 1024 * 1024)\"")
            chatty = await sb.exec("yes | head -c 100000")
            return slow, big, chatty

    slow, big, chatty = run(go())
    assert slow.timed_out and slow.return_code == 124 and slow.duration_s < 10
    assert big.return_code != 0 and "MemoryError" in big.stderr
    assert len(chatty.stdout) < 1200 and "bytes elided" in chatty.stdout


@needs_bwrap
def test_cleanup_on_error_and_cancellation(tmp_path):
    async def go():
        sb = await start_sandbox(None, tmp_path / "t1")
        task = asyncio.ensure_future(sb.exec("sleep 30"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await sb.stop()
        bad = tmp_path / "env"
        bad.mkdir()
        (bad / "Dockerfile").write_text("FROM x\nWORKDIR /app\nRUN exit 3\n")
        with pytest.raises(SandboxStartError, match="exit 3"):
            await start_sandbox(bad, tmp_path / "t2")

    run(go())
    assert not (tmp_path / "t1").exists() and not (tmp_path / "t2").exists()


def test_missing_bubblewrap_names_the_package(monkeypatch, tmp_path):
    isolation.check_isolation.cache_clear()
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    try:
        with pytest.raises(SandboxUnavailableError, match="apt-get install -y bubblewrap"):
            run(LocalSandbox(tmp_path / "t").start())
    finally:
        isolation.check_isolation.cache_clear()


@needs_bwrap
@PERSISTENT
def test_system_paths_are_not_writable(tmp_path, persistent):
    async def go():
        async with await start_sandbox(None, tmp_path / "trial", persistent=persistent) as sb:
            with pytest.raises(PermissionError):
                sb.host_path("/usr/bin/evil")
            return await sb.exec("touch /usr/evil")

    assert run(go()).return_code != 0


@needs_bwrap
def test_container_keeps_background_processes_between_commands_and_stop_kills_them(tmp_path):
    async def go():
        sb = await start_sandbox(None, tmp_path / "trial", persistent=True)
        try:
            await sb.exec("tmux new-session -d -s agent 'sleep 300'")
            listed = await sb.exec("tmux ls")
            host_pid = sb.container.pid
        finally:
            await sb.stop()
        return listed, host_pid

    listed, host_pid = run(go())
    assert listed.return_code == 0 and "agent:" in listed.stdout
    status = Path(f"/proc/{host_pid}/status")
    gone = not status.exists() or "State:\tZ" in status.read_text()  # dead (maybe not yet reaped by pid 1)
    assert gone, "the container's init must be gone after stop()"
    assert not (tmp_path / "trial").exists()


def test_a_process_that_only_carries_the_init_command_in_its_argv_is_not_the_init_shell():
    """bwrap's own argv (and its child's before the exec) holds the init's command line: the readiness check
    matched it at once (session 29: one oracle trial in 120 ran its solution in a half-built root, exit 127)."""
    import subprocess
    import sys
    like_bwrap = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--", "/bin/sh", "-c",
                                   f"while :; do {isolation.INIT_MARK.decode()}; done"])
    shell = subprocess.Popen([isolation.INIT_SHELL.decode(), "-c", f"read x; : '{isolation.INIT_MARK.decode()}'"],
                             stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not isolation._runs_init_shell(shell.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the shell has exec'd
        assert isolation._runs_init_shell(shell.pid)
        assert not isolation._runs_init_shell(like_bwrap.pid)
    finally:
        for p in (like_bwrap, shell):
            p.kill()
            p.wait()


@needs_bwrap
def test_a_container_is_ready_only_once_its_init_shell_runs(tmp_path, monkeypatch):
    """Session 19: a command entering the namespace before bwrap's root was final found no ``setpriv`` (the
    readiness probe could run in the host root the child still had before its pivot_root). ``start`` now
    waits for the init shell, which bwrap starts only on the final root, before it probes."""
    assert not isolation._runs_init_shell(None) and not isolation._runs_init_shell(os.getpid())
    seen = []
    real = isolation._runs_init_shell
    monkeypatch.setattr(isolation, "_runs_init_shell", lambda pid: seen.append(real(pid)) or seen[-1])

    async def go():
        c = isolation.Container([(str(tmp_path), "/work")], network=False)
        await c.start()
        try:
            assert isolation._runs_init_shell(c.pid)  # the shell runs when start returns
            probe = await asyncio.create_subprocess_exec(*c.exec_argv({"PATH": isolation.DEFAULT_PATH}, "/", "ls /usr/bin/setpriv"),
                                                         stdout=asyncio.subprocess.PIPE)
            return (await probe.communicate())[0].decode()
        finally:
            await c.kill()

    assert run(go()).strip() == "/usr/bin/setpriv"
    assert seen and seen[-1] is True  # start polled for the shell until it ran
