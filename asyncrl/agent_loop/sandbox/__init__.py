"""Sandboxed (SWE-style) agent loop: Harbor-format tasks, a Docker-free local sandbox, retries.

::

    dataset row (extra_info.task_dir) -> SandboxAgentLoop.run  ("swe_agent", loop.py)
        for each attempt (retry.py policy):
            proxy.open_session -> (token, base_url)          trajectory proxy (token-in-token-out)
            LocalSandbox.start(task/environment)  env.py     bwrap, per-trial /app /logs /tmp
            agent(base_url, sandbox)              bash_agent.py | oracle | harbor_runner.py
            upload tests -> bash /tests/test.sh   verifier -> /logs/verifier/reward.{txt,json}
            proxy.pop_session -> AgentLoopOutput (tokens from the proxy, reward from the verifier)

Submodules ``task``, ``dockerfile``, ``env`` and ``retry`` use only the standard library, so the
Harbor environment plugin (Python 3.12 env) can load them without the rest of asyncrl.
Names below are imported lazily for the same reason.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "HarborTask": "task", "TaskConfig": "task", "TaskFormatError": "task", "load_task": "task",
    "list_tasks": "task", "example_rows": "task", "read_verifier_result": "task", "EXAMPLES_DIR": "task",
    "LocalSandbox": "env", "SandboxLimits": "env", "ExecResult": "env", "SandboxUnavailableError": "env",
    "SandboxStartError": "env", "start_sandbox": "env", "check_isolation": "env",
    "RetryPolicy": "retry", "ErrorKind": "retry", "Action": "retry",
    "BashAgent": "bash_agent",
    "SandboxAgentLoop": "loop", "SandboxLoopConfig": "loop", "sandbox_stats": "loop",
    "HarborRunner": "harbor_runner", "harbor_status": "harbor_runner", "TrialFailedError": "retry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
