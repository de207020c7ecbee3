"""LocalSandbox: a per-trial, Docker-free sandbox built on bubblewrap (``bwrap``).

::

    trial_dir/                      host side (removed by stop(), unless keep=True)
      root/app/   -> /app           the task's workdir (Dockerfile COPYs land here)
      root/logs/  -> /logs          /logs/agent, /logs/verifier (reward.txt / reward.json)
      root/tmp/   -> /tmp           root/root/ -> /root (HOME)
      root/tests/ -> /tests         only after upload_dir(tests, "/tests") at verify time
    host /usr, /etc (a few files)   read-only: the "base image"

Every :meth:`LocalSandbox.exec` is a fresh ``bwrap`` process (like ``docker exec``): new user,
pid, network, IPC and UTS namespaces, all capabilities dropped, no network unless asked (only a
private loopback), ``prlimit`` CPU-seconds / address-space / file-size limits, a wall-clock
timeout that kills the whole pid namespace, and output capped in size. A sandboxed process sees
only the trial's ``root/`` directories plus read-only system files, so it cannot read other
trials' files, the repository, or the host's ``/tmp``.

Every top-level directory under ``root/`` is bind-mounted at ``/<name>``; uploading to
``/tests`` creates ``root/tests`` and later commands see it. System paths (``/usr``, ``/etc``, ...)
cannot be written.

This module uses only the standard library (the Harbor environment plugin imports it from the
Python 3.12 Harbor env).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .dockerfile import plan_build

logger = logging.getLogger(__name__)

SYSTEM_DIRS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "sys",
                         "run", "var", "boot", "opt", "srv", "mnt", "media"})
"""Top-level names that are never trial-writable (the host's read-only "image")."""
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf",
             "hosts", "localtime", "ssl", "ca-certificates", "python3", "python3.11", "bash.bashrc", "profile",
             "inputrc", "mime.types", "magic", "debian_version", "os-release")
"""``/etc`` entries visible read-only inside the sandbox (the rest of ``/etc`` is hidden)."""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxUnavailableError(RuntimeError):
    """The isolation tools are missing or do not work here (the message says what to install)."""


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


@functools.lru_cache(maxsize=1)
def check_isolation() -> str:
    """Verify that bubblewrap and prlimit exist and that a namespace sandbox starts.

    Returns:
        The ``bwrap`` path.

    Raises:
        SandboxUnavailableError: naming the Debian package to install (``bubblewrap`` or
            ``util-linux``), or the kernel setting that blocks user namespaces.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError(
            "bubblewrap (bwrap) is not installed; the local sandbox needs it: apt-get install -y bubblewrap")
    if shutil.which("prlimit") is None:
        raise SandboxUnavailableError("prlimit is not installed; apt-get install -y util-linux")
    probe = subprocess.run([bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", *_system_binds(),
                            "--", "/bin/true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise SandboxUnavailableError(
            f"bubblewrap cannot create namespaces here ({probe.stderr.strip()}); enable unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0) or run as root")
    return bwrap


def _system_binds() -> list[str]:
    """Read-only binds of the host userland: /usr, its merged-usr symlinks, a few /etc files."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args + ["--proc", "/proc", "--dev", "/dev"]


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
    """

    def __init__(self, trial_dir: str | Path, *, workdir: str = "/app", network: bool = False,
                 limits: Optional[SandboxLimits] = None, env: Optional[dict[str, str]] = None, keep: bool = False):
        self.trial_dir = Path(trial_dir).resolve()
        self.root = self.trial_dir / "root"
        self.workdir = workdir
        self.network = network
        self.limits = limits or SandboxLimits()
        self.env = dict(env or {})
        self.keep = keep
        self.started = False
        self._procs: set[asyncio.subprocess.Process] = set()

    # ----------------------------------------------------------------------------- lifecycle
    async def start(self, environment_dir: Optional[str | Path] = None, build_timeout_sec: float = 600.0) -> None:
        """Create the trial directories and apply the task's ``environment/`` (see :mod:`.dockerfile`).

        Args:
            environment_dir: the task's ``environment/``; with a ``Dockerfile`` its WORKDIR / COPY /
                ENV / RUN are applied, without one its files are copied into the workdir.
            build_timeout_sec: wall-clock budget for all ``RUN`` steps together.

        Raises:
            SandboxUnavailableError: bubblewrap / prlimit missing or not working.
            SandboxStartError: a COPY source is missing, a RUN step fails or times out.
        """
        check_isolation()
        for d in ("tmp", "root", "logs/agent", "logs/verifier", self.workdir.strip("/")):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.started = True
        if environment_dir is None:
            return
        env_dir = Path(environment_dir)
        dockerfile = env_dir / "Dockerfile"
        if not dockerfile.is_file():
            for item in env_dir.iterdir():
                if item.name != "docker-compose.yaml":
                    await self.upload(item, f"{self.workdir}/{item.name}")
            return
        try:
            plan = plan_build(dockerfile.read_text())
        except ValueError as e:
            raise SandboxStartError(f"{dockerfile}: {e}") from None
        self.workdir = plan.workdir
        (self.root / self.workdir.strip("/")).mkdir(parents=True, exist_ok=True)
        self.env = {**plan.env, **self.env}
        deadline = time.monotonic() + build_timeout_sec
        for kind, a, b in plan.steps:
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
            PermissionError: the path is relative, escapes with ``..``, or is a system directory.
        """
        if not path.startswith("/"):
            path = f"{self.workdir}/{path}"
        parts = [p for p in Path(path).parts[1:] if p not in ("", ".")]
        if not parts or ".." in parts or parts[0] in SYSTEM_DIRS:
            raise PermissionError(f"sandbox path {path!r} is not in a trial-owned directory")
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
        """The full ``prlimit ... bwrap ... bash -c command`` argv (exposed for logging and tests)."""
        lim = self.limits
        argv = ["prlimit"]
        if lim.cpu_time_sec:
            argv.append(f"--cpu={int(lim.cpu_time_sec)}")
        if lim.memory_mb:
            argv.append(f"--as={int(lim.memory_mb) << 20}")
        if lim.file_size_mb:
            argv.append(f"--fsize={int(lim.file_size_mb) << 20}")
        argv += ["--", check_isolation(), "--die-with-parent", "--new-session", "--unshare-all", "--unshare-user",
                 "--uid", "0", "--gid", "0", "--cap-drop", "ALL", "--hostname", "sandbox"]
        if self.network:
            argv += ["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
        argv += _system_binds()
        for top in sorted(p.name for p in self.root.iterdir() if p.is_dir()):
            argv += ["--bind", str(self.root / top), f"/{top}"]
        full_env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", **self.env, **(env or {})}
        argv.append("--clearenv")
        for k, v in full_env.items():
            argv += ["--setenv", k, str(v)]
        argv += ["--chdir", cwd or self.workdir, "--", "/bin/bash", "-c", command]
        return argv

    async def exec(self, command: str, *, cwd: Optional[str] = None, env: Optional[dict[str, str]] = None,
                   timeout_sec: Optional[float] = None, stdin: Optional[bytes] = None) -> ExecResult:
        """Run ``bash -c command`` in a fresh sandbox process.

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
        """SIGKILL the process group; bwrap's --die-with-parent then tears down the pid namespace."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


async def start_sandbox(task_environment_dir: Optional[str | Path], trial_dir: str | Path, *,
                        memory_mb: Optional[int] = None, network: bool = False,
                        env: Optional[dict[str, str]] = None, build_timeout_sec: float = 600.0,
                        limits: Optional[SandboxLimits] = None, keep: bool = False) -> LocalSandbox:
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

    Raises:
        SandboxUnavailableError, SandboxStartError: see :meth:`LocalSandbox.start`.
    """
    limits = limits or SandboxLimits()
    if memory_mb is not None:
        limits = SandboxLimits(**{**limits.__dict__, "memory_mb": memory_mb})
    sandbox = LocalSandbox(trial_dir, network=network, limits=limits, env=env, keep=keep)
    try:
        await sandbox.start(task_environment_dir, build_timeout_sec)
    except BaseException:
        await sandbox.stop()
        raise
    return sandbox

