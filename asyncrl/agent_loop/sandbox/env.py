"""LocalSandbox: a per-trial, Docker-free sandbox built on bubblewrap (``bwrap``).

::

    trial_dir/                      host side (removed by stop(), unless keep=True)
      root/app/   -> /app           the task's workdir (Dockerfile COPYs land here)
      root/logs/  -> /logs          /logs/agent, /logs/verifier (reward.txt / reward.json)
      root/tmp/   -> /tmp           root/root/ -> /root (HOME)
      root/tests/ -> /tests         only after upload_dir(tests, "/tests") at verify time
    host /usr, /etc (a few files)   read-only: the "base image"

By default every :meth:`LocalSandbox.exec` is a fresh ``bwrap`` sandbox; with ``persistent=True``
commands join one long-lived container instead, so background processes survive between them
(see :mod:`.isolation`). Either way: new user, pid, network, IPC and UTS namespaces, all
capabilities dropped, no network unless asked (only a private loopback), ``prlimit`` CPU-seconds /
address-space / file-size limits, a wall-clock timeout that kills the command's process group,
and output capped in size. A sandboxed process sees
only the trial's ``root/`` directories plus read-only system files, so it cannot read other
trials' files, the repository, or the host's ``/tmp``.

Every top-level directory under ``root/`` is bind-mounted at ``/<name>``; uploading to
``/tests`` creates ``root/tests`` and later commands see it (a persistent container binds the
directories that exist at start, plus ``/tests``, ``/solution``, ``/runtime`` and
``/installed-agent``, created empty). System paths (``/usr``, ``/etc``, ...) cannot be written.

This module uses only the standard library (the Harbor environment plugin imports it from the
Python 3.12 Harbor env).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .dockerfile import plan_build
from .isolation import (DEFAULT_PATH, SYSTEM_DIRS, Container, SandboxUnavailableError, bwrap_argv,
                        check_isolation, limits_prefix)

logger = logging.getLogger(__name__)

PERSISTENT_DIRS = ("tests", "solution", "runtime", "installed-agent")
"""Extra top-level directories a persistent container binds (Harbor uploads there later)."""
__all__ = ["ExecResult", "LocalSandbox", "SandboxLimits", "SandboxStartError", "SandboxUnavailableError",
           "check_isolation", "start_sandbox"]


class SandboxStartError(RuntimeError):
    """The sandbox could not be set up (task files, Dockerfile ``RUN`` step failed, ...)."""


@dataclass
class ExecResult:
    """Outcome of one sandboxed command.

    Attributes:
        stdout: decoded standard output (capped, middle part elided with a marker).
        stderr: decoded standard error (capped the same way).
        return_code: exit status; ``-9`` / 137-style values after a kill, ``124`` on timeout.
        timed_out: the wall-clock timeout fired and the namespace was killed.
        duration_s: wall-clock seconds.
    """

    stdout: str
    stderr: str
    return_code: int
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass
class SandboxLimits:
    """Per-command resource limits (``prlimit``); ``None`` leaves a limit unset.

    Attributes:
        cpu_time_sec: RLIMIT_CPU, CPU seconds per command.
        memory_mb: RLIMIT_AS, address space per process in MiB.
        file_size_mb: RLIMIT_FSIZE, largest file a command may write, MiB.
        max_output_bytes: stdout / stderr kept per command (each).
        default_timeout_sec: wall-clock timeout when ``exec`` is given none.
    """

    cpu_time_sec: Optional[int] = 600
    memory_mb: Optional[int] = 2048
    file_size_mb: Optional[int] = 1024
    max_output_bytes: int = 64 * 1024
    default_timeout_sec: float = 600.0


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> str:
    """Read a stream to EOF keeping the first and last ``cap // 2`` bytes."""
    head, tail, dropped = bytearray(), bytearray(), 0
    while chunk := await stream.read(65536):
        room = cap // 2 - len(head)
        if room > 0:
            head += chunk[:room]
            chunk = chunk[room:]
        tail += chunk
        if len(tail) > cap // 2:
            dropped += len(tail) - cap // 2
            del tail[: len(tail) - cap // 2]
    marker = f"\n[... {dropped} bytes elided ...]\n".encode() if dropped else b""
    return (bytes(head) + marker + bytes(tail)).decode("utf-8", errors="replace")


class LocalSandbox:
    """One trial's sandbox. Use as ``async with LocalSandbox(...) as sb:`` for guaranteed cleanup.

    Args:
        trial_dir: host directory owned by this trial (created; removed on :meth:`stop`).
        workdir: the task's working directory inside the sandbox (from ``WORKDIR``).
        network: keep the host network (``allow_internet``); default: loopback only.
        limits: per-command resource limits.
        env: environment variables for every command (on top of PATH/HOME/LANG).
        keep: leave ``trial_dir`` on disk after :meth:`stop` (debugging).
        persistent: run every command in one long-lived container (Terminus-2's tmux needs it)
            instead of a fresh sandbox per command.
    """

    def __init__(self, trial_dir: str | Path, *, workdir: str = "/app", network: bool = False,
                 limits: Optional[SandboxLimits] = None, env: Optional[dict[str, str]] = None, keep: bool = False,
                 persistent: bool = False):
        self.trial_dir = Path(trial_dir).resolve()
        self.root = self.trial_dir / "root"
        self.workdir = workdir
        self.network = network
        self.limits = limits or SandboxLimits()
        self.env = dict(env or {})
        self.keep = keep
        self.persistent = persistent
        self.started = False
        self.container: Optional[Container] = None
        self._procs: set[asyncio.subprocess.Process] = set()

    # ----------------------------------------------------------------------------- lifecycle
    async def start(self, environment_dir: Optional[str | Path] = None, build_timeout_sec: float = 600.0) -> None:
        """Create the trial directories and apply the task's ``environment/`` (see :mod:`.dockerfile`).

        Args:
            environment_dir: the task's ``environment/``; with a ``Dockerfile`` its WORKDIR / COPY /
                ENV / RUN are applied, without one its files are copied into the workdir.
            build_timeout_sec: wall-clock budget for all ``RUN`` steps together.

        Raises:
            SandboxUnavailableError: bubblewrap / util-linux tools missing or not working.
            SandboxStartError: a COPY source is missing, a RUN step fails or times out, the
                persistent container does not come up.
        """
        check_isolation()
        env_dir = Path(environment_dir) if environment_dir is not None else None
        dockerfile = env_dir / "Dockerfile" if env_dir is not None else None
        steps: list[tuple[str, str, str]] = []
        if dockerfile is not None and dockerfile.is_file():
            try:
                plan = plan_build(dockerfile.read_text())
            except ValueError as e:
                raise SandboxStartError(f"{dockerfile}: {e}") from None
            self.workdir, self.env, steps = plan.workdir, {**plan.env, **self.env}, plan.steps
        tops = ["tmp", "root", "logs/agent", "logs/verifier", self.workdir.strip("/")]
        tops += [b.strip("/").split("/")[0] for kind, _, b in steps if kind == "copy"]
        for d in tops + (list(PERSISTENT_DIRS) if self.persistent else []):
            self.host_path("/" + d).mkdir(parents=True, exist_ok=True)
        if self.persistent:
            binds = [(str(p), f"/{p.name}") for p in sorted(self.root.iterdir()) if p.is_dir()]
            self.container = Container(binds, self.network)
            try:
                await self.container.start()
            except RuntimeError as e:
                raise SandboxStartError(str(e)) from None
        self.started = True
        if env_dir is not None and dockerfile is not None and not dockerfile.is_file():
            for item in env_dir.iterdir():
                if item.name != "docker-compose.yaml":
                    await self.upload(item, f"{self.workdir}/{item.name}")
        deadline = time.monotonic() + build_timeout_sec
        for kind, a, b in steps:
            if kind == "copy":
                src = (env_dir / a).resolve()
                if not src.exists() or env_dir.resolve() not in (src, *src.parents):
                    raise SandboxStartError(f"{dockerfile}: COPY source {a!r} not found in {env_dir}")
                dst = b + src.name if b.endswith("/") and src.is_file() else b
                await self.upload(src, dst)
            else:
                res = await self.exec(a, cwd=b, timeout_sec=max(1.0, deadline - time.monotonic()))
                if res.return_code != 0:
                    raise SandboxStartError(f"{dockerfile}: RUN {a!r} failed ({res.return_code}"
                                            f"{', timed out' if res.timed_out else ''}): {res.stderr[-2000:]}")

    async def stop(self) -> None:
        """Kill any running command and remove ``trial_dir`` (unless ``keep``). Idempotent."""
        for proc in list(self._procs):
            self._kill(proc)
        for proc in list(self._procs):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)
        if self.container is not None:
            await self.container.kill()
            self.container = None
        self.started = False
        if not self.keep:
            await asyncio.to_thread(shutil.rmtree, self.trial_dir, True)

    async def __aenter__(self) -> "LocalSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----------------------------------------------------------------------------- files
    def host_path(self, path: str) -> Path:
        """Host location of an absolute sandbox path in a trial-owned directory.

        Raises:
            PermissionError: the path escapes with ``..``, is a system directory, or (persistent
                container) lies outside the directories bound at start.
        """
        if not path.startswith("/"):
            path = f"{self.workdir}/{path}"
        parts = [p for p in Path(path).parts[1:] if p not in ("", ".")]
        if not parts or ".." in parts or parts[0] in SYSTEM_DIRS:
            raise PermissionError(f"sandbox path {path!r} is not in a trial-owned directory")
        if self.container is not None and not (self.root / parts[0]).is_dir():
            raise PermissionError(f"sandbox path {path!r}: /{parts[0]} was not bound when the container started")
        return self.root.joinpath(*parts)

    async def upload(self, source: str | Path, target: str) -> None:
        """Copy a host file or directory to ``target`` inside the sandbox (merging directories)."""
        src, dst = Path(source), self.host_path(target)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            await asyncio.to_thread(shutil.copytree, src, dst, symlinks=True, dirs_exist_ok=True)
        else:
            await asyncio.to_thread(shutil.copy2, src, dst)

    async def download(self, source: str, target: str | Path) -> None:
        """Copy a sandbox file or directory out to the host path ``target``."""
        src, dst = self.host_path(source), Path(target)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            await asyncio.to_thread(shutil.copytree, src, dst, symlinks=True, dirs_exist_ok=True)
        else:
            await asyncio.to_thread(shutil.copy2, src, dst)

    # ----------------------------------------------------------------------------- exec
    def command(self, command: str, cwd: Optional[str] = None, env: Optional[dict[str, str]] = None) -> list[str]:
        """The full ``prlimit ... (bwrap | nsenter) ... bash -c command`` argv (for logging and tests)."""
        lim = self.limits
        full_env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm",
                    **self.env, **(env or {})}
        prefix = limits_prefix(lim.cpu_time_sec, lim.memory_mb, lim.file_size_mb)
        if self.container is not None:
            return prefix + self.container.exec_argv(full_env, cwd or self.workdir, command)
        binds = [(str(p), f"/{p.name}") for p in sorted(self.root.iterdir()) if p.is_dir()]
        return prefix + bwrap_argv(binds, self.network, full_env, cwd or self.workdir, command)

    async def exec(self, command: str, *, cwd: Optional[str] = None, env: Optional[dict[str, str]] = None,
                   timeout_sec: Optional[float] = None, stdin: Optional[bytes] = None) -> ExecResult:
        """Run ``bash -c command`` in the sandbox (a fresh one, or the persistent container).

        Args:
            command: shell command line.
            cwd: working directory inside the sandbox (default: the workdir).
            env: extra environment variables for this command.
            timeout_sec: wall-clock limit in seconds (default ``limits.default_timeout_sec``); on
                expiry the pid namespace is killed and ``timed_out`` is set (return code 124).
            stdin: bytes fed to the command's standard input (default: none, EOF).

        Raises:
            RuntimeError: the sandbox was not started.
            SandboxUnavailableError: isolation tools missing.
        """
        if not self.started:
            raise RuntimeError("LocalSandbox.exec before start()")
        timeout = self.limits.default_timeout_sec if timeout_sec is None else timeout_sec
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *self.command(command, cwd, env), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        self._procs.add(proc)
        cap = self.limits.max_output_bytes
        readers = [asyncio.ensure_future(_read_capped(proc.stdout, cap)),
                   asyncio.ensure_future(_read_capped(proc.stderr, cap))]
        timed_out = False
        try:
            if stdin:
                proc.stdin.write(stdin)
                with contextlib.suppress(ConnectionError):
                    await proc.stdin.drain()
            proc.stdin.close()
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), timeout)
            except asyncio.TimeoutError:
                timed_out = True
                self._kill(proc)
                await proc.wait()
            done, _ = await asyncio.wait(readers, timeout=5)
            out, err = (r.result() if r in done else "" for r in readers)
        finally:
            if proc.returncode is None:  # cancelled: never leave a sandbox running
                self._kill(proc)
            for r in readers:
                r.cancel()
            self._procs.discard(proc)
        return ExecResult(out, err, 124 if timed_out else proc.returncode, timed_out, time.monotonic() - t0)

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process) -> None:
        """SIGKILL the command's process group (per-command mode: bwrap's --die-with-parent then
        tears down its pid namespace)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


async def start_sandbox(task_environment_dir: Optional[str | Path], trial_dir: str | Path, *,
                        memory_mb: Optional[int] = None, network: bool = False,
                        env: Optional[dict[str, str]] = None, build_timeout_sec: float = 600.0,
                        limits: Optional[SandboxLimits] = None, keep: bool = False,
                        persistent: bool = False) -> LocalSandbox:
    """Create and start a :class:`LocalSandbox`; on a failed start the trial dir is removed.

    Args:
        task_environment_dir: the task's ``environment/`` directory (or ``None``).
        trial_dir: host directory for this trial.
        memory_mb: overrides ``limits.memory_mb`` (the task's ``memory_mb``).
        network: keep host networking.
        env: extra environment variables for every command.
        build_timeout_sec: budget for Dockerfile ``RUN`` steps.
        limits: resource limits.
        keep: keep the trial dir after stop.
        persistent: one long-lived container for all commands (background processes survive).

    Raises:
        SandboxUnavailableError, SandboxStartError: see :meth:`LocalSandbox.start`.
    """
    limits = limits or SandboxLimits()
    if memory_mb is not None:
        limits = SandboxLimits(**{**limits.__dict__, "memory_mb": memory_mb})
    sandbox = LocalSandbox(trial_dir, network=network, limits=limits, env=env, keep=keep, persistent=persistent)
    try:
        await sandbox.start(task_environment_dir, build_timeout_sec)
    except BaseException:
        await sandbox.stop()
        raise
    return sandbox

