"""Config of the agent-loop layer (``actor_rollout_ref.rollout.agent.*``): workers and the sandboxed loop.

Part of the schema in :mod:`asyncrl.config_schema`; import the names from :mod:`asyncrl.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class SandboxConfig:
    """Settings of the ``swe_agent`` loop (one instance per worker process is typical)."""

    agent: str = "bash"
    """``bash`` (built-in), ``oracle`` (runs solution/solve.sh), or ``harbor:<name>`` (Harbor agent)."""
    max_turns: int = 8
    """Model calls per trial for the bash agent (>= 1)."""
    command_timeout_sec: float = 60.0
    """Wall-clock limit of one bash command, seconds."""
    compact_prompt: bool = False
    """Bash agent without system prompt and with a minimal tool schema (short-context models)."""
    max_tokens_per_turn: Optional[int] = None
    """Completion budget per model call; ``None``: the rollout's ``max_tokens``."""
    max_concurrent_sandboxes: int = 4
    """Sandboxes alive at once in this process (extra trials wait; see :func:`sandbox_stats`)."""
    max_retries: int = 2
    """Retries after the first attempt for retryable errors (0 = one attempt)."""
    retry_actions: dict[str, str] = field(default_factory=dict)
    """Overrides of the retry table by error kind, e.g. ``{"agent_timeout": "retry"}``."""
    agent_timeout_sec: Optional[float] = None
    """Overrides ``[agent].timeout_sec`` of every task (seconds > 0); ``None`` = each task's own."""
    verifier_timeout_sec: Optional[float] = None
    """Overrides ``[verifier].timeout_sec`` of every task (seconds > 0); ``None`` = each task's own."""
    cpu_time_sec: int = 600
    """RLIMIT_CPU per sandboxed command, CPU seconds (0 = no limit)."""
    trials_dir: Optional[str] = None
    """Where per-attempt trajectory dirs go (proxy dumps, agent/verifier logs); default a temp dir."""
    keep_sandboxes: bool = False
    """Keep sandbox trial dirs on disk (debugging)."""
    harbor_python: Optional[str] = None
    """Python of the Harbor env for ``harbor:`` agents; default ``$ASYNCRL_HARBOR_PYTHON`` or .venv-harbor."""


@dataclass
class AgentConfig:
    default_agent_loop: str = "single_turn_agent"
    """Agent loop for rows that carry no ``agent_name``."""
    num_workers: int = 1
    """AgentLoopWorker actors (0 = run agent loops inside the rollouter process)."""
    coalesce_group_requests: bool = True
    """A prompt group's engine requests that reach one replica in the same event-loop turn (the ``n``
    single-turn trajectories) share one Ray call, streamed: each result returns, and its load-balancer
    lease ends, when the engine ends that request (``asyncrl.rollout.client.coalesced``). On the 2-core
    vLLM demo it cut the trainer's fetch wait to 0.83-0.95x (benchmarks/RESULTS.md, session 11)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Settings of the sandboxed ``swe_agent`` loop."""
