"""Run one real Harbor ``Trial`` and write a JSON summary: the out-of-process half of the Harbor runner.

Run with the Harbor env's Python (>= 3.12)::

    .venv-harbor/bin/python asyncrl/agent_loop/sandbox/harbor_trial.py SPEC.json RESULT.json

``SPEC.json``: ``{"task_dir", "trials_dir", "trial_name", "agent", "model_name", "base_url",
"agent_kwargs", "agent_timeout_sec", "environment_kwargs"}``. ``RESULT.json``: ``{"reward",
"rewards", "exception_type", "exception_message", "timings" (seconds per phase), "trial_dir",
"agent", "agent_exit_code"}`` (the last from Harbor's ``agent/exit-code.txt``, which its oracle agent
writes when the solution exits non-zero and otherwise ignores; ``None`` when absent). This file imports
only the standard library, Harbor, and this directory (as the synthetic package ``asyncrl_sandbox``),
never the rest of asyncrl.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

PACKAGE = "asyncrl_sandbox"


def _register_package() -> None:
    """Make this directory importable as ``asyncrl_sandbox`` (for the environment plugin)."""
    here = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location(PACKAGE, here / "__init__.py", submodule_search_locations=[str(here)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)


def _seconds(timing) -> float:
    if timing is None or timing.started_at is None or timing.finished_at is None:
        return 0.0
    return (timing.finished_at - timing.started_at).total_seconds()


async def run_trial(spec: dict) -> dict:
    """Build the ``TrialConfig``, run the trial, and summarise its ``TrialResult``."""
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    agent = AgentConfig(name=spec["agent"], model_name=spec.get("model_name"),
                        override_timeout_sec=spec.get("agent_timeout_sec"), kwargs=spec.get("agent_kwargs") or {})
    config = TrialConfig(
        task=TaskConfig(path=Path(spec["task_dir"])),
        trial_name=spec["trial_name"],
        trials_dir=Path(spec["trials_dir"]),
        agent=agent,
        environment=EnvironmentConfig(import_path=f"{PACKAGE}.harbor_plugin:LocalSandboxEnvironment",
                                      kwargs=spec.get("environment_kwargs") or {}),
    )
    trial = await Trial.create(config)
    result = await trial.run()
    rewards = dict(result.verifier_result.rewards or {}) if result.verifier_result else None
    reward = None
    if rewards:
        reward = float(rewards["reward"]) if "reward" in rewards else sum(map(float, rewards.values())) / len(rewards)
    exc = result.exception_info
    exit_code_file = Path(spec["trials_dir"]) / spec["trial_name"] / "agent" / "exit-code.txt"
    agent_exit_code = int(exit_code_file.read_text().strip()) if exit_code_file.is_file() else None
    total = _seconds(result)  # TrialResult has started_at / finished_at like a TimingInfo
    return {
        "reward": reward,
        "rewards": rewards,
        "exception_type": exc.exception_type if exc else None,
        "exception_message": exc.exception_message if exc else None,
        "timings": {"env_setup": _seconds(result.environment_setup), "agent_setup": _seconds(result.agent_setup),
                    "agent_execute": _seconds(result.agent_execution), "verifier": _seconds(result.verifier),
                    "total": total},
        "trial_dir": str(Path(spec["trials_dir"]) / spec["trial_name"]),
        "agent": spec["agent"],
        "agent_exit_code": agent_exit_code,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: harbor_trial.py SPEC.json RESULT.json\n")
        return 2
    _register_package()
    spec = json.loads(Path(argv[1]).read_text())
    summary = asyncio.run(run_trial(spec))
    Path(argv[2]).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
