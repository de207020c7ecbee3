"""Run real Harbor trials out of process (Harbor needs Python >= 3.12; asyncrl runs on 3.11).

::

    HarborRunner.run_trial(task_dir, agent="terminus-2", base_url=<proxy session URL>)
        writes SPEC.json -> subprocess: <harbor python> harbor_trial.py SPEC.json RESULT.json
                                  Trial.create(TrialConfig(agent, environment=LocalSandboxEnvironment))
                                  Trial.run(): env start -> agent setup -> agent run -> verifier
                                  (the agent's LLM calls go to base_url: the trajectory proxy)
        reads RESULT.json -> HarborTrialResult(reward, timings, error mapped to retry kinds)

The Harbor env is found through ``$ASYNCRL_HARBOR_PYTHON`` or ``<repo>/.venv-harbor/bin/python``
(``scripts/setup_harbor_env.sh`` creates it). Harbor's exception types come back by name and map
onto :class:`~.retry.ErrorKind` (``AgentTimeoutError`` -> keep reward, ``ContextLengthExceededError``
-> reward 0, ``NonZeroAgentExitCodeError`` -> keep reward, verifier errors -> retry, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .retry import ErrorKind, TrialError, classify

logger = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[3]
TRIAL_SCRIPT = Path(__file__).resolve().parent / "harbor_trial.py"
DEFAULT_MODEL = "openai/asyncrl-policy"
"""LiteLLM model name: the ``openai/`` provider speaks plain OpenAI HTTP to ``api_base`` (our proxy)."""


class HarborUnavailableError(RuntimeError):
    """No usable Harbor env (the message says how to create one)."""


class HarborTrialError(TrialError):
    """A Harbor exception reported by name; ``kind`` follows :data:`~.retry.HARBOR_ERROR_KINDS`."""

    def __init__(self, exception_type: str, message: str):
        super().__init__(f"{exception_type}: {message}")
        self.exception_type = exception_type
        self.kind = classify(exception_type)


@dataclass
class HarborTrialResult:
    """Summary of one Harbor trial.

    Attributes:
        reward: scalar reward (``rewards["reward"]`` or the mean), ``None`` without a verifier result.
        rewards: Harbor's ``verifier_result.rewards``.
        error: the trial's exception as a :class:`HarborTrialError`, or ``None``.
        timings: seconds per phase: ``env_setup``, ``agent_setup``, ``agent_execute``, ``verifier``, ``total``.
        trial_dir: Harbor's trial directory (logs, result.json, agent trajectory).
        agent: the Harbor agent name.
        agent_exit_code: the agent's non-zero exit code where Harbor recorded one and went on (its oracle
            agent: a solution script that failed), else ``None``.
    """

    reward: Optional[float]
    rewards: Optional[dict[str, float]]
    error: Optional[HarborTrialError]
    timings: dict[str, float] = field(default_factory=dict)
    trial_dir: str = ""
    agent: str = ""
    agent_exit_code: Optional[int] = None


def find_harbor_python(explicit: Optional[str] = None) -> Optional[str]:
    """The Harbor env's interpreter: ``explicit`` (no fallback), else ``$ASYNCRL_HARBOR_PYTHON``, else
    ``<repo>/.venv-harbor``; ``None`` when the chosen file does not exist."""
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for candidate in (os.environ.get("ASYNCRL_HARBOR_PYTHON"), str(REPO_ROOT / ".venv-harbor/bin/python")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=8)
def harbor_status(python: Optional[str] = None) -> tuple[bool, str]:
    """``(available, reason)``: whether a Python >= 3.12 with ``harbor`` importable is configured."""
    exe = find_harbor_python(python)
    if exe is None:
        where = f"{python} does not exist; " if python else ""
        return False, (f"{where}no Harbor env: run scripts/setup_harbor_env.sh "
                       "(creates .venv-harbor with Python >= 3.12) "
                       "or set ASYNCRL_HARBOR_PYTHON")
    probe = subprocess.run([exe, "-c", "import sys, harbor, importlib.metadata as m; "
                                       "assert sys.version_info >= (3, 12); print(m.version('harbor'))"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return False, f"{exe} cannot import harbor (or is older than 3.12): {probe.stderr.strip()[-300:]}"
    return True, f"harbor {probe.stdout.strip()} at {exe}"


class HarborRunner:
    """Launches :mod:`.harbor_trial` with the Harbor env's Python.

    Args:
        python: Harbor env interpreter (default: :func:`find_harbor_python`).
        model: LiteLLM model name for model-backed agents.
        environment_kwargs: extra kwargs for :class:`~.harbor_plugin.LocalSandboxEnvironment`.
    """

    def __init__(self, python: Optional[str] = None, model: str = DEFAULT_MODEL,
                 environment_kwargs: Optional[dict[str, Any]] = None):
        self.python, self.model = python, model
        self.environment_kwargs = dict(environment_kwargs or {})

    def agent_kwargs(self, agent: str, base_url: Optional[str], max_turns: Optional[int]) -> dict[str, Any]:
        """Harbor agent kwargs: model-backed agents get ``api_base`` = the proxy session URL."""
        if agent in ("oracle", "nop") or base_url is None:
            return {}
        kwargs: dict[str, Any] = {"api_base": base_url}
        if agent == "terminus-2":
            # small local policy: no summarisation sub-calls, no asciinema recording
            kwargs.update(enable_summarize=False, record_terminal_session=False,
                          model_info={"max_input_tokens": 32768, "max_output_tokens": 4096,
                                      "input_cost_per_token": 0.0, "output_cost_per_token": 0.0})
        if max_turns is not None and agent == "terminus-2":
            kwargs["max_turns"] = max_turns
        return kwargs

    async def run_trial(self, task_dir: str | Path, *, agent: str = "oracle", base_url: Optional[str] = None,
                        trials_dir: str | Path, agent_timeout_sec: Optional[float] = None,
                        max_turns: Optional[int] = None, agent_kwargs: Optional[dict[str, Any]] = None,
                        timeout_sec: float = 3600.0) -> HarborTrialResult:
        """Run one Harbor trial of ``task_dir`` with ``agent`` and return its summary.

        Args:
            task_dir: Harbor task directory.
            agent: Harbor agent name (``oracle``, ``terminus-2``, ``nop``, ...).
            base_url: OpenAI base URL for model-backed agents (a proxy session's ``base_url``).
            trials_dir: where Harbor writes the trial directory (created).
            agent_timeout_sec: overrides the task's ``[agent].timeout_sec``.
            max_turns: Terminus-2 episode cap.
            agent_kwargs: extra Harbor agent kwargs (merged over the defaults).
            timeout_sec: wall-clock limit for the whole subprocess, seconds.

        Raises:
            HarborUnavailableError: no Harbor env (see :func:`harbor_status`).
            RuntimeError: the subprocess failed before writing a result (its log tail included).
        """
        ok, reason = harbor_status(self.python)
        if not ok:
            raise HarborUnavailableError(reason)
        exe = find_harbor_python(self.python)
        trials = Path(trials_dir).resolve()
        trials.mkdir(parents=True, exist_ok=True)
        name = f"{Path(task_dir).name}__{uuid.uuid4().hex[:8]}"
        spec_path, result_path, log_path = (trials / f"{name}.{s}" for s in ("spec.json", "result.json", "log"))
        spec = {"task_dir": str(Path(task_dir).resolve()), "trials_dir": str(trials), "trial_name": name,
                "agent": agent, "model_name": self.model if base_url else None,
                "agent_timeout_sec": agent_timeout_sec, "environment_kwargs": self.environment_kwargs,
                "agent_kwargs": {**self.agent_kwargs(agent, base_url, max_turns), **(agent_kwargs or {})}}
        spec_path.write_text(json.dumps(spec, indent=1))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env.setdefault("OPENAI_API_KEY", "asyncrl-proxy")  # LiteLLM wants a key; the proxy ignores it
        with open(log_path, "wb") as log:
            proc = await asyncio.create_subprocess_exec(exe, str(TRIAL_SCRIPT), str(spec_path), str(result_path),
                                                        stdout=log, stderr=subprocess.STDOUT, env=env,
                                                        start_new_session=True)
            try:
                rc = await asyncio.wait_for(proc.wait(), timeout_sec)
            finally:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, 9)
                    await proc.wait()
        if rc != 0 or not result_path.is_file():
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"harbor trial subprocess exited with {rc}; log {log_path}:\n{tail}")
        data = json.loads(result_path.read_text())
        error = HarborTrialError(data["exception_type"], data.get("exception_message") or "") \
            if data.get("exception_type") else None
        if error is not None and error.kind is ErrorKind.OTHER:
            logger.warning("harbor trial %s failed: %s", name, error)
        return HarborTrialResult(reward=data.get("reward"), rewards=data.get("rewards"), error=error,
                                 timings=data.get("timings", {}), trial_dir=data.get("trial_dir", ""), agent=agent,
                                 agent_exit_code=data.get("agent_exit_code"))
