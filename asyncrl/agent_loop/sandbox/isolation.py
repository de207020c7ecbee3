"""Namespace isolation primitives for :mod:`.env`: bubblewrap argv, resource limits, a persistent container.

Two ways to run a command, both with new user / pid / network / IPC / UTS namespaces, every
capability dropped, the host's ``/usr`` and a few ``/etc`` files read-only, and only the trial's
own directories bound read-write:

- **per command** (:func:`bwrap_argv`): each command is its own ``bwrap`` sandbox; nothing outlives
  it. Simple and leak-free; what the built-in bash agent uses.
- **persistent container** (:class:`Container`): one ``bwrap`` runs a sleeper as the namespace's
  init; commands join its namespaces with ``nsenter`` and drop all capabilities with ``setpriv``.
  Background processes (e.g. Terminus-2's ``tmux`` server) survive between commands, as in
  ``docker exec``; killing the container tears the whole pid namespace down.

Standard library only (imported by the Harbor plugin in the Python 3.12 env).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Optional, Sequence

SYSTEM_DIRS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "sys",
                         "run", "var", "boot", "opt", "srv", "mnt", "media"})
"""Top-level names that are never trial-writable (the host's read-only "image")."""
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf",
             "hosts", "localtime", "ssl", "ca-certificates", "python3", "python3.11", "bash.bashrc", "profile",
             "inputrc", "mime.types", "magic", "debian_version", "os-release", "terminfo")
"""``/etc`` entries visible read-only inside the sandbox (the rest of ``/etc`` is hidden)."""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NS_FLAGS = ("--die-with-parent", "--new-session", "--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0",
             "--cap-drop", "ALL", "--hostname", "sandbox")


class SandboxUnavailableError(RuntimeError):
    """The isolation tools are missing or do not work here (the message says what to install)."""


@functools.lru_cache(maxsize=1)
def check_isolation() -> str:
    """Verify that bubblewrap, prlimit, nsenter and setpriv exist and that a sandbox starts.

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
    for tool in ("prlimit", "nsenter", "setpriv"):
        if shutil.which(tool) is None:
            raise SandboxUnavailableError(f"{tool} is not installed; apt-get install -y util-linux")
    probe = subprocess.run([bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", *system_binds(),
                            "--", "/bin/true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise SandboxUnavailableError(
            f"bubblewrap cannot create namespaces here ({probe.stderr.strip()}); enable unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0) or run as root")
    return bwrap


def system_binds() -> list[str]:
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


def limits_prefix(cpu_time_sec: Optional[int], memory_mb: Optional[int], file_size_mb: Optional[int]) -> list[str]:
    """``prlimit`` argv prefix: RLIMIT_CPU (s), RLIMIT_AS (MiB), RLIMIT_FSIZE (MiB); ``None`` = unset."""
    argv = ["prlimit"]
    if cpu_time_sec:
        argv.append(f"--cpu={int(cpu_time_sec)}")
    if memory_mb:
        argv.append(f"--as={int(memory_mb) << 20}")
    if file_size_mb:
        argv.append(f"--fsize={int(file_size_mb) << 20}")
    return argv + ["--"]


def namespace_argv(binds: Sequence[tuple[str, str]], network: bool) -> list[str]:
    """``bwrap`` argv (no command) for the given read-write ``(host, sandbox)`` binds."""
    argv = [check_isolation(), *_NS_FLAGS]
    if network:
        argv += ["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
    argv += system_binds()
    for host, target in binds:
        argv += ["--bind", host, target]
    return argv


def bwrap_argv(binds: Sequence[tuple[str, str]], network: bool, env: dict[str, str], cwd: str,
               command: str) -> list[str]:
    """A complete per-command sandbox: ``bwrap ... --clearenv --setenv ... --chdir cwd bash -c command``."""
    argv = namespace_argv(binds, network) + ["--clearenv"]
    for k, v in env.items():
        argv += ["--setenv", k, str(v)]
    return argv + ["--chdir", cwd, "--", "/bin/bash", "-c", command]


INIT_MARK = b"sleep 3600 & wait"
"""A piece of the container init's command line (``Container.start``): its shell runs once the root is final.
bwrap's own argv holds the same text (the command it will exec), so only a process whose ``argv[0]`` is the
shell counts (:func:`_runs_init_shell`)."""
INIT_SHELL = b"/bin/sh"


def _runs_init_shell(pid: Optional[int]) -> bool:
    """Whether bwrap's pid-1 process ``pid`` (or a child of it) runs the container's init shell yet (Linux
    ``/proc``: ``task/<pid>/children``, else a scan of every process's parent).

    The shell is a process whose ``argv[0]`` is :data:`INIT_SHELL` and whose command line holds
    :data:`INIT_MARK`. bwrap itself (and its forked child before the ``exec``) also has the mark in its
    argv: matching on the mark alone (sessions 19-28) said "ready" at once, the probe then could run in the
    host root before bwrap's pivot_root, pass, and leave later commands to land mid-setup (``setpriv`` or
    ``/app`` not found: exit 127 / 125, one oracle trial in 120 under concurrent starts, session 29)."""
    if pid is None:
        return False

    def cmdline(p: int) -> bytes:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                return f.read()
        except OSError:
            return b""

    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        kids = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                            kids.append(int(d))
                except (OSError, ValueError, IndexError):
                    pass

    def is_shell(cmd: bytes) -> bool:
        return cmd.split(b"\0", 1)[0] == INIT_SHELL and INIT_MARK in cmd

    return any(is_shell(cmdline(p)) for p in (pid, *kids))


class Container:
    """A persistent namespace set whose init is a sleeper; commands join it with ``nsenter``.

    Args:
        binds: read-write ``(host_dir, sandbox_path)`` binds, fixed for the container's life.
        network: share the host network.
        prefix: argv prefix for the init (resource limits).
    """

    def __init__(self, binds: Sequence[tuple[str, str]], network: bool, prefix: Sequence[str] = ()):
        self.binds, self.network, self.prefix = list(binds), network, list(prefix)
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.pid: Optional[int] = None

    async def start(self, timeout_sec: float = 30.0) -> None:
        """Start the init and learn its host pid from ``bwrap --info-fd``.

        Raises:
            SandboxUnavailableError: isolation tools missing.
            RuntimeError: bwrap exited or did not report within ``timeout_sec``.
        """
        r, w = os.pipe()
        try:
            argv = self.prefix + namespace_argv(self.binds, self.network) + [
                "--info-fd", str(w), "--", INIT_SHELL.decode(), "-c",
                f"trap 'exit 0' TERM; while :; do {INIT_MARK.decode()}; done"]
            self.proc = await asyncio.create_subprocess_exec(
                *argv, pass_fds=(w,), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
            os.close(w)
            w = -1
            info = await asyncio.wait_for(asyncio.to_thread(_read_json_object, r), timeout_sec)
        except BaseException:
            await self.kill()
            raise
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        if "child-pid" not in info:
            err = (await self.proc.stderr.read()).decode(errors="replace") if self.proc else ""
            await self.kill()
            raise RuntimeError(f"sandbox container did not start: {err.strip() or info}")
        self.pid = int(info["child-pid"])
        await self._wait_ready(timeout_sec)

    async def _wait_ready(self, timeout_sec: float) -> None:
        """bwrap reports the pid before its mounts are final, and a command can run in the namespace before
        them too (the host's root is still the child's until its pivot_root; a command entering between the
        pivot and the last bind found no ``setpriv``: a failed test under load, session 19). bwrap starts the
        init's shell only once the root is final: poll until that shell runs, then until a command runs inside."""
        loop = asyncio.get_running_loop()
        deadline, err = loop.time() + timeout_sec, b""
        while loop.time() < deadline and not _runs_init_shell(self.pid):
            if self.proc is not None and self.proc.returncode is not None:
                break
            await asyncio.sleep(0.005)
        while loop.time() < deadline:
            probe = await asyncio.create_subprocess_exec(
                *self.exec_argv({"PATH": DEFAULT_PATH}, "/", "true"), stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE)
            _, err = await probe.communicate()
            if probe.returncode == 0:
                return
            if self.proc is not None and self.proc.returncode is not None:
                break
            await asyncio.sleep(0.02)
        await self.kill()
        raise RuntimeError(f"sandbox container did not become ready: {err.decode(errors='replace').strip()}")

    def exec_argv(self, env: dict[str, str], cwd: str, command: str) -> list[str]:
        """``nsenter`` into every namespace, drop all capabilities, clear env, ``cd``, run ``command``."""
        if self.pid is None:
            raise RuntimeError("container not started")
        return ["nsenter", "-t", str(self.pid), "--all", "--", "setpriv", "--bounding-set=-all", "--inh-caps=-all",
                "--no-new-privs", "--", "env", "-i", "-C", cwd, *[f"{k}={v}" for k, v in env.items()],
                "/bin/bash", "-c", command]

    async def kill(self) -> None:
        """SIGKILL the namespace's init (the kernel then kills every process in the pid namespace)
        and the bwrap process group; wait until the init is gone."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.proc.wait(), 10)
        if self.pid is not None:
            for _ in range(500):  # the init is not our child: poll /proc until it is dead (or a zombie)
                if _dead(self.pid):
                    break
                await asyncio.sleep(0.01)
        self.pid = None


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)
    except OSError:
        return True


def _read_json_object(fd: int) -> dict:
    """Read ``bwrap --info-fd`` output until one JSON object is complete (or EOF)."""
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        with contextlib.suppress(ValueError):
            return json.loads(data)
    try:
        return json.loads(data) if data else {}
    except ValueError:
        return {}
