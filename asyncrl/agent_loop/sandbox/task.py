"""Harbor task format: read a task directory, parse verifier rewards, build dataset rows.

A Harbor task is a directory (https://harborframework.com/docs/tasks)::

    my-task/
      task.toml          timeouts, resources, metadata
      instruction.md     what the agent is told
      environment/       Dockerfile (+ files it COPYs) describing the agent's machine
      tests/test.sh      the verifier; writes /logs/verifier/reward.txt (one float)
                         or /logs/verifier/reward.json (flat {name: number})
      solution/solve.sh  optional oracle solution

Both the old (``version = "1.0"``, ``memory = "2G"``) and new (``schema_version``, ``memory_mb``)
spellings of ``task.toml`` are read. Keys we do not use are kept in :attr:`HarborTask.raw_config`.
"""

from __future__ import annotations

import json
import logging
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

logger = logging.getLogger(__name__)

EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "examples" / "tasks"
"""The example tasks shipped with the repository (``examples/tasks/``)."""

DEFAULT_AGENT_TIMEOUT_SEC = 600.0
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0


class TaskFormatError(ValueError):
    """A task directory does not follow the Harbor task format (the message names the file)."""


@dataclass
class TaskConfig:
    """The parts of ``task.toml`` the sandbox and the loop act on.

    Attributes:
        agent_timeout_sec: wall-clock budget of the agent phase (seconds).
        verifier_timeout_sec: wall-clock budget of ``tests/test.sh`` (seconds).
        build_timeout_sec: budget of environment setup (Dockerfile ``RUN`` lines), seconds.
        cpus: CPU cores the task asks for (informational for the local sandbox).
        memory_mb: address-space limit per sandboxed process (MiB).
        storage_mb: disk the task asks for (informational).
        allow_internet: whether the sandbox keeps the host network.
        verifier_env: extra environment variables for the verifier.
        agent_env: extra environment variables for the agent's commands.
        metadata: free-form ``[metadata]`` table.
    """

    agent_timeout_sec: float = DEFAULT_AGENT_TIMEOUT_SEC
    verifier_timeout_sec: float = DEFAULT_VERIFIER_TIMEOUT_SEC
    build_timeout_sec: float = 600.0
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    allow_internet: bool = False
    verifier_env: dict[str, str] = field(default_factory=dict)
    agent_env: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class HarborTask:
    """One task directory, validated.

    Attributes:
        path: absolute task directory.
        name: ``[task].name`` if given, else the directory name.
        instruction: contents of ``instruction.md``.
        config: parsed :class:`TaskConfig`.
        raw_config: the whole ``task.toml`` as a dict.
    """

    path: Path
    name: str
    instruction: str
    config: TaskConfig
    raw_config: dict[str, Any] = field(default_factory=dict)

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()


def _size_mb(value: Any) -> int:
    """``2048`` / ``"2G"`` / ``"512M"`` -> MiB."""
    if isinstance(value, (int, float)):
        return int(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[iI]?[bB]?\s*", str(value))
    if not m:
        raise ValueError(f"unreadable size {value!r}")
    scale = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def _table(raw: dict, name: str, where: Path) -> dict:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        raise TaskFormatError(f"{where}: [{name}] must be a table")
    return value


def parse_task_config(raw: dict, where: Path) -> TaskConfig:
    """Map a parsed ``task.toml`` onto :class:`TaskConfig`.

    Raises:
        TaskFormatError: a section is not a table or a value has the wrong type.
    """
    agent, verifier = _table(raw, "agent", where), _table(raw, "verifier", where)
    env = _table(raw, "environment", where)
    try:
        memory = env["memory_mb"] if "memory_mb" in env else env.get("memory", 2048)
        storage = env["storage_mb"] if "storage_mb" in env else env.get("storage", 10240)
        return TaskConfig(
            agent_timeout_sec=float(agent.get("timeout_sec", DEFAULT_AGENT_TIMEOUT_SEC)),
            verifier_timeout_sec=float(verifier.get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_SEC)),
            build_timeout_sec=float(env.get("build_timeout_sec", 600.0)),
            cpus=float(env.get("cpus", 1)),
            memory_mb=_size_mb(memory),
            storage_mb=_size_mb(storage),
            allow_internet=bool(env.get("allow_internet", False)),
            verifier_env={str(k): str(v) for k, v in dict(verifier.get("env", {})).items()},
            agent_env={str(k): str(v) for k, v in dict(agent.get("env", {})).items()},
            metadata=dict(raw.get("metadata", {})),
        )
    except (TypeError, ValueError) as e:
        raise TaskFormatError(f"{where}: {e}") from None


def load_task(path: str | Path) -> HarborTask:
    """Read and validate one Harbor task directory.

    Args:
        path: the task directory.

    Returns:
        The parsed :class:`HarborTask`.

    Raises:
        TaskFormatError: ``task.toml``, ``instruction.md`` or ``tests/test.sh`` is missing, or
            ``task.toml`` does not parse.
    """
    root = Path(path).resolve()
    for rel in ("task.toml", "instruction.md", "tests/test.sh"):
        if not (root / rel).is_file():
            raise TaskFormatError(f"{root}: missing {rel} (not a Harbor task directory)")
    try:
        raw = tomllib.loads((root / "task.toml").read_text())
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(f"{root / 'task.toml'}: {e}") from None
    name = str(_table(raw, "task", root / "task.toml").get("name") or root.name)
    return HarborTask(path=root, name=name, instruction=(root / "instruction.md").read_text(),
                      config=parse_task_config(raw, root / "task.toml"), raw_config=raw)


def list_tasks(root: str | Path = EXAMPLES_DIR) -> list[HarborTask]:
    """All task directories directly under ``root`` (those with a ``task.toml``), sorted by name."""
    return [load_task(p) for p in sorted(Path(root).iterdir()) if (p / "task.toml").is_file()]


@dataclass
class VerifierResult:
    """What the verifier left in ``/logs/verifier``.

    Attributes:
        reward: the scalar used for training: ``rewards["reward"]`` when present, else the only
            value, else the mean of all values.
        rewards: every named reward (``{"reward": x}`` for ``reward.txt``).
    """

    reward: float
    rewards: dict[str, float]


def read_verifier_result(verifier_dir: str | Path) -> Optional[VerifierResult]:
    """Parse ``reward.txt`` (preferred) or ``reward.json`` from a verifier log directory.

    Returns:
        The result, or ``None`` when neither file exists or the content is unreadable (logged);
        the retry policy treats ``None`` as "no verifier result".
    """
    d = Path(verifier_dir)
    txt, js = d / "reward.txt", d / "reward.json"
    try:
        if txt.is_file():
            value = float(txt.read_text().strip())
            rewards = {"reward": value}
        elif js.is_file():
            data = json.loads(js.read_text())
            if not isinstance(data, dict) or not data:
                raise ValueError("reward.json must be a non-empty flat object")
            rewards = {str(k): float(v) for k, v in data.items()}
        else:
            return None
    except (ValueError, TypeError) as e:
        logger.warning("unreadable verifier reward in %s: %s", d, e)
        return None
    if not all(math.isfinite(v) for v in rewards.values()):
        logger.warning("non-finite verifier reward in %s: %s", d, rewards)
        return None
    if "reward" in rewards:
        reward = rewards["reward"]
    else:
        reward = sum(rewards.values()) / len(rewards)
    return VerifierResult(reward=reward, rewards=rewards)


def task_row(task: HarborTask, index: int = 0, split: str = "train") -> dict[str, Any]:
    """A verl-schema row that routes a task to the ``swe_agent`` loop.

    The prompt is the instruction (what the sandboxed agent is told); the verifier decides the
    reward, so ``reward_model.ground_truth`` is empty and the loop fills ``reward_score`` itself.
    """
    return {
        "data_source": "harbor",
        "prompt": [{"role": "user", "content": task.instruction}],
        "ability": "swe",
        "reward_model": {"style": "verifier", "ground_truth": ""},
        "extra_info": {"task_dir": str(task.path), "task_name": task.name, "split": split, "index": index},
        "agent_name": "swe_agent",
    }


def example_rows(size: Optional[int] = None, seed: int = 0, split: str = "train", operators: str = "",
                 root: str | Path = EXAMPLES_DIR) -> list[dict[str, Any]]:
    """Rows for the example tasks (``examples/tasks/``), cycled to ``size`` rows.

    The signature matches :data:`asyncrl.data.dataset.TaskGenerator`, so
    ``register_task("swe_examples", example_rows)`` works as is; ``seed`` rotates the start and
    ``operators`` is ignored. Train and test splits hold the same tasks (there are only a few).

    Raises:
        TaskFormatError: an example task is malformed.
    """
    tasks = list_tasks(root)
    if not tasks:
        raise TaskFormatError(f"no Harbor tasks under {root}")
    n = len(tasks) if size is None else size
    return [task_row(tasks[(seed + i) % len(tasks)], i, split) for i in range(n)]
