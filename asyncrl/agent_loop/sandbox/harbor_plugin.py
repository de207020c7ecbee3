"""Harbor environment plugin backed by :class:`~.env.LocalSandbox` (runs inside the Harbor 3.12 env).

Harbor drives environments through ``start / exec / upload_* / download_* / stop``. This plugin
maps them onto a persistent-container :class:`LocalSandbox` (bubblewrap namespaces, no Docker),
so a real Harbor ``Trial`` with a real Harbor agent (Terminus-2 keeps a tmux session alive
between commands) runs on a machine without a container engine.

Loaded by :mod:`.harbor_trial` as ``asyncrl_sandbox.harbor_plugin:LocalSandboxEnvironment``
(a synthetic package over this directory, so none of asyncrl's heavy imports are needed).
Deliberate simplifications: the ``user`` argument is ignored (commands run as uid 0 of the
sandbox's user namespace, without capabilities); network is all (``public``) or nothing
(``no-network``), no allowlists; outputs are copied, not mounted.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode

from .env import LocalSandbox, SandboxLimits

logger = logging.getLogger(__name__)
ENVIRONMENT_TYPE = "asyncrl-local"


class LocalSandboxEnvironment(BaseEnvironment):
    """A Harbor environment whose "container" is an asyncrl :class:`LocalSandbox`.

    Extra ``EnvironmentConfig.kwargs``:
        cpu_time_sec: RLIMIT_CPU per command (CPU seconds), default 600.
        keep: keep the sandbox directory after the trial (debugging), default False.
        default_timeout_sec: wall-clock limit for commands Harbor runs without one, default 3600.
    """

    def __init__(self, *args: Any, cpu_time_sec: int = 600, keep: bool = False,
                 default_timeout_sec: float = 3600.0, **kwargs: Any):
        self._sandbox: LocalSandbox | None = None
        self._cpu_time_sec, self._keep, self._default_timeout_sec = cpu_time_sec, keep, default_timeout_sec
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        if not Path(self.environment_dir).is_dir():
            raise FileNotFoundError(f"task environment directory {self.environment_dir} not found")

    def _require(self) -> LocalSandbox:
        if self._sandbox is None:
            raise RuntimeError("LocalSandboxEnvironment used before start()")
        return self._sandbox

    async def start(self, force_build: bool) -> None:
        memory_mb = self._effective_memory_mb or self.task_env_config.memory_mb
        limits = SandboxLimits(cpu_time_sec=self._cpu_time_sec, memory_mb=memory_mb,
                               default_timeout_sec=self._default_timeout_sec)
        network = self._network_policy.network_mode == NetworkMode.PUBLIC
        sandbox = LocalSandbox(Path(self.trial_paths.trial_dir) / "sandbox", network=network, limits=limits,
                               keep=self._keep, persistent=True)
        try:
            await sandbox.start(self.environment_dir, float(self.task_env_config.build_timeout_sec))
        except BaseException:
            await sandbox.stop()
            raise
        self._sandbox = sandbox
        logger.debug("local sandbox for %s started (network=%s, memory=%s MiB)", self.session_id, network, memory_mb)

    async def stop(self, delete: bool) -> None:
        if self._sandbox is not None:
            self._sandbox.keep = self._keep or not delete
            await self._sandbox.stop()
            self._sandbox = None

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._require().upload(source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._require().upload(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._require().download(source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._require().download(source_dir, target_dir)

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        """Run a command in the sandbox.

        Raises:
            RuntimeError: the command ran past ``timeout_sec`` (as Harbor's Docker environment does).
        """
        res = await self._require().exec(command, cwd=cwd, env=self._merge_env(env), timeout_sec=timeout_sec)
        if res.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=res.stdout, stderr=res.stderr, return_code=res.return_code)
