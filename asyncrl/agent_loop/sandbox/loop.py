"""SandboxAgentLoop (``swe_agent``): one sandboxed Harbor-format trial per rollout sample.

::

    run(sampling_params, **row)                     row.extra_info.task_dir -> HarborTask
      RetryPolicy.run(attempt)                      fresh session + trajectory dir per attempt
        attempt k:
          proxy.open_session(request_id-a{k})  -> (token, base_url)
          async with SANDBOX_GATE:                  cap on concurrent sandboxes (sandbox_stats())
            env_setup      start_sandbox(task/environment)            LocalSandbox (bwrap)
            agent_setup    build the agent                            bash | oracle
            agent_execute  agent.run(task, sandbox, base_url)         <= [agent].timeout_sec
            verifier       /tests <- tests/, bash /tests/test.sh      <= [verifier].timeout_sec
            sandbox.stop()                                            always
          proxy.pop_session(token) -> tokens, masks, logprobs         always
        -> AttemptOutcome(reward, error kind)  -> keep / zero / retry / TrialFailedError
      AgentLoopOutput: proxy tokens, reward_score = the policy's reward,
                       metrics agent/sandbox/{env_setup,agent_setup,agent_execute,verifier,total} (s),
                       agent/sandbox/slot_wait (s waiting for a sandbox slot), agent/sandbox/attempts,
                       agent/sandbox/errors/<kind> (attempts that ended with that error kind)

Agents named ``harbor:<agent>`` (e.g. ``harbor:terminus-2``) run as real Harbor trials out of
process (:mod:`.harbor_runner`); Harbor times its own phases and the same metrics are reported.
Semantics from seed ``000`` sections 3-4 (BuiltinSWEAgentLoop, Harbor Trial phases).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from asyncrl.agent_loop.base import AgentLoopBase, AgentLoopOutput, register
from asyncrl.config import SandboxConfig
from asyncrl.rollout.client import GenerationAborted

from .bash_agent import AgentRunResult, make_agent
from .env import SandboxLimits, start_sandbox
from .retry import (AgentTimeoutError, AttemptOutcome, NonZeroAgentExitCodeError, RetryPolicy, TrialError, classify)
from .task import HarborTask, load_task, read_verifier_result

logger = logging.getLogger(__name__)
PHASES = ("env_setup", "agent_setup", "agent_execute", "verifier", "total")


SandboxLoopConfig = SandboxConfig  # the dataclass lives in asyncrl.config (one source of defaults)


class SandboxGate:
    """Process-wide cap on live sandboxes: an ``asyncio.Semaphore`` plus counters for the funnel."""

    def __init__(self, limit: int = 4):
        self.limit, self.active, self.waiting, self.started = limit, 0, 0, 0
        self._sem: Optional[asyncio.Semaphore] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def configure(self, limit: int) -> None:
        """Set the cap; takes effect at once when idle, else when the current sandboxes drain."""
        if limit < 1:
            raise ValueError(f"max_concurrent_sandboxes must be >= 1, got {limit}")
        if limit != self.limit:
            self.limit, self._sem = limit, (None if self.active == 0 else self._sem)

    @contextlib.asynccontextmanager
    async def slot(self):
        loop = asyncio.get_running_loop()
        if self._sem is None or self._loop is not loop:  # a new event loop (tests) gets a fresh one
            self._sem, self._loop = asyncio.Semaphore(self.limit), loop
        sem = self._sem
        self.waiting += 1
        try:
            await sem.acquire()
        finally:
            self.waiting -= 1
        self.active += 1
        self.started += 1
        try:
            yield
        finally:
            self.active -= 1
            sem.release()


SANDBOX_GATE = SandboxGate()


def sandbox_stats() -> dict[str, int]:
    """``{"active", "limit", "waiting", "started"}`` sandboxes of this process (funnel widget)."""
    g = SANDBOX_GATE
    return {"active": g.active, "limit": g.limit, "waiting": g.waiting, "started": g.started}


def _resolve_config(config: Any, override: Optional[SandboxLoopConfig]) -> SandboxLoopConfig:
    if override is not None:
        return override
    agent_cfg = getattr(getattr(getattr(config, "actor_rollout_ref", None), "rollout", None), "agent", None)
    found = getattr(agent_cfg, "sandbox", None)
    if found is None or isinstance(found, SandboxLoopConfig):
        return found or SandboxLoopConfig()
    # a config section of another class (e.g. declared in asyncrl.config): copy the fields it has
    return SandboxLoopConfig(**{f.name: getattr(found, f.name) for f in dataclasses.fields(SandboxLoopConfig)
                                if hasattr(found, f.name)})


@register("swe_agent")
class SandboxAgentLoop(AgentLoopBase):
    """Runs a Harbor-format task in a local sandbox with an agent that talks to the trajectory proxy.

    Args:
        server_manager: engine client (``generate``), used by the proxy.
        tokenizer: the policy tokenizer (the proxy renders with its chat template).
        config: the ExperimentConfig; ``actor_rollout_ref.rollout.agent.sandbox`` (a
            :class:`SandboxLoopConfig`) is used when present.
        sandbox_config: explicit :class:`SandboxLoopConfig` (wins over ``config``).
        proxy: a started or startable :class:`~asyncrl.agent_loop.proxy.TrajectoryProxy`; else the
            worker's (``worker.get_proxy()``); else one owned by this loop.
        worker: the AgentLoopWorker (passed by the worker).
        agent: an agent instance to use instead of ``sandbox_config.agent`` (custom in-process
            agents; anything with ``name`` and ``async run(task, sandbox, base_url)``).

    Attributes:
        last_agent_result: the :class:`AgentRunResult` of the latest local attempt (debugging).
    """

    def __init__(self, server_manager: Any, tokenizer: Any, config: Any, *, sandbox_config: Optional[
            SandboxLoopConfig] = None, proxy: Any = None, worker: Any = None, agent: Any = None, **kwargs: Any):
        super().__init__(server_manager, tokenizer, config)
        self.cfg = _resolve_config(config, sandbox_config)
        self.policy = RetryPolicy(self.cfg.max_retries, dict(self.cfg.retry_actions))
        self._proxy, self._worker, self._own_proxy = proxy, worker, None
        self.agent = agent
        self._running = 0  # concurrent run() calls (the worker runs n samples on one loop instance)
        self.last_agent_result: Optional[AgentRunResult] = None
        SANDBOX_GATE.configure(self.cfg.max_concurrent_sandboxes)

    async def _get_proxy(self) -> Any:
        if self._proxy is not None:
            return self._proxy
        if self._worker is not None and hasattr(self._worker, "get_proxy"):
            return await self._worker.get_proxy()
        if self._own_proxy is None:
            from asyncrl.agent_loop.proxy import TrajectoryProxy

            self._own_proxy = TrajectoryProxy(self.server_manager, self.tokenizer)
        return self._own_proxy

    async def close(self) -> None:
        """Stop a proxy this loop created itself once no run uses it (a passed-in or worker proxy is
        left running)."""
        if self._own_proxy is not None and self._running == 0:
            await self._own_proxy.stop()
            self._own_proxy = None

    # ------------------------------------------------------------------------------------ run
    async def run(self, sampling_params: Any, **sample: Any) -> AgentLoopOutput:
        """One trial (with retries) for a row whose ``extra_info.task_dir`` names a Harbor task.

        Returns:
            The proxy's tokens as an :class:`AgentLoopOutput` with ``reward_score`` from the verifier
            (after the retry policy), phase timings in ``metrics`` and the attempt history in
            ``extra_fields["sandbox"]``.

        Raises:
            KeyError: the row carries no task directory.
            TaskFormatError: the task directory is malformed.
            TrialFailedError: every allowed attempt hit a retryable error (the sample is failed
                with that reason).
            GenerationAborted: a generation was aborted with ``partial_rollout`` off (the
                rollouter drops the sample), never retried.
        """
        extra = sample.get("extra_info") or {}
        task_dir = extra.get("task_dir") or sample.get("task_dir")
        if not task_dir:
            raise KeyError("swe_agent rows need extra_info.task_dir (a Harbor task directory)")
        task = load_task(task_dir)
        rid = str(sample.get("request_id") or uuid.uuid4().hex[:12])
        root = Path(self.cfg.trials_dir or Path(tempfile.gettempdir()) / "asyncrl-trials") / rid
        overrides = {"temperature": sampling_params.temperature, "top_p": sampling_params.top_p,
                     "max_tokens": self.cfg.max_tokens_per_turn or sampling_params.max_tokens}
        t0 = time.perf_counter()
        self._running += 1
        try:
            decision = await self.policy.run(lambda k: self._attempt(task, f"{rid}-a{k}", root / f"attempt-{k}",
                                                                     overrides), reraise=(GenerationAborted,))
        finally:
            self._running -= 1
            await self.close()
        outcome = decision.outcome
        payload = outcome.payload or {}  # empty when the final attempt raised (e.g. "other" -> zero_reward)
        output: AgentLoopOutput = payload.get("output") or AgentLoopOutput([], [], [], [])
        output.reward_score = decision.reward
        if not output.prompt_ids and sample.get("prompt_ids"):  # no model turn recorded (e.g. oracle)
            output.prompt_ids = list(sample["prompt_ids"])
        if not output.has_version:  # no model turn (e.g. oracle): the version its engine serves now
            output.set_version_span(fallback=await self.server_manager.engine_version(rid))
        output.metrics["agent/sandbox/attempts"] = len(decision.attempts)
        for a in decision.attempts:  # each attempt's error, counted by kind (the step's and eval's metrics)
            if a.error_kind is not None:
                key = f"agent/sandbox/errors/{a.error_kind.value}"
                output.metrics[key] = output.metrics.get(key, 0) + 1
        output.metrics["agent/sandbox/wall_s"] = time.perf_counter() - t0
        output.extra_fields["sandbox"] = {
            "task": task.name, "agent": self.cfg.agent, "reward": decision.reward,
            "action": decision.action.value if decision.action else None,
            "rewards": payload.get("rewards"), "exit_reason": payload.get("exit_reason"),
            "trajectory_dir": payload.get("trajectory_dir"),
            "attempts": [{"error_kind": a.error_kind.value if a.error_kind else None, "error": a.error,
                          "reward": a.reward} for a in decision.attempts]}
        return output

    async def _attempt(self, task: HarborTask, request_id: str, traj_dir: Path, overrides: dict) -> AttemptOutcome:
        """One attempt: fresh proxy session, sandbox, agent, verifier; always pops and cleans up."""
        proxy = await self._get_proxy()
        token, base_url = await proxy.open_session(request_id=request_id, trajectory_dir=str(traj_dir),
                                                   sampling_overrides=overrides)
        timings, slot_wait = dict.fromkeys(PHASES, 0.0), 0.0
        t_total = time.perf_counter()
        failure: Optional[Exception] = None
        try:
            t_wait = time.perf_counter()
            async with SANDBOX_GATE.slot():
                slot_wait = time.perf_counter() - t_wait
                if self.agent is None and self.cfg.agent.startswith("harbor:"):
                    reward, rewards, error, exit_reason = await self._harbor_trial(task, base_url, traj_dir, timings)
                else:
                    reward, rewards, error, exit_reason = await self._local_trial(task, base_url, traj_dir, timings)
        except Exception as e:  # decided below, once the session is popped
            failure = e
        finally:
            traj = await proxy.pop_session(token)
        engine_error = traj.extra_fields.get("engine_error")
        if engine_error and engine_error.startswith("GenerationAborted"):
            # partial_rollout is off and a weight sync aborted a request: drop the sample, like the
            # other loops do, instead of retrying the trial (the rollouter counts the drop)
            raise GenerationAborted(f"a request of trial {request_id} was aborted: {engine_error}")
        if failure is not None:
            raise failure
        timings["total"] = time.perf_counter() - t_total
        output = traj.to_agent_loop_output()
        output.metrics.update({f"agent/sandbox/{k}": v for k, v in timings.items()})
        output.metrics["agent/sandbox/slot_wait"] = slot_wait
        if error is None and engine_error:
            error = RuntimeError(f"engine error during the trial: {engine_error}")
        payload = {"output": output, "rewards": rewards, "exit_reason": exit_reason, "trajectory_dir": str(traj_dir)}
        return AttemptOutcome(reward=reward, error_kind=classify(error),
                              error=f"{type(error).__name__}: {error}" if error else "", payload=payload)

    async def _local_trial(self, task: HarborTask, base_url: str, traj_dir: Path, timings: dict) -> tuple:
        """Local sandbox + built-in agent. Returns ``(reward, rewards, error, exit_reason)``."""
        cfg = self.cfg
        t = time.perf_counter()
        sandbox_dir = Path(tempfile.mkdtemp(prefix=f"asyncrl-sbx-{task.path.name}-"))
        limits = SandboxLimits(cpu_time_sec=cfg.cpu_time_sec, memory_mb=task.config.memory_mb)
        try:
            sandbox = await start_sandbox(task.environment_dir, sandbox_dir, network=task.config.allow_internet,
                                          env=task.config.agent_env, build_timeout_sec=task.config.build_timeout_sec,
                                          limits=limits, keep=cfg.keep_sandboxes)
        except BaseException:
            if not cfg.keep_sandboxes:
                shutil.rmtree(sandbox_dir, ignore_errors=True)
            raise
        timings["env_setup"] = time.perf_counter() - t
        error: Optional[BaseException] = None
        result: Optional[AgentRunResult] = None
        try:
            t = time.perf_counter()
            agent = self.agent or self._make_agent()
            timings["agent_setup"] = time.perf_counter() - t
            t = time.perf_counter()
            timeout = cfg.agent_timeout_sec or task.config.agent_timeout_sec
            try:
                result = self.last_agent_result = await asyncio.wait_for(agent.run(task, sandbox, base_url), timeout)
                if result.exit_code != 0:
                    error = NonZeroAgentExitCodeError(f"agent {agent.name} exited with {result.exit_code}")
            except asyncio.TimeoutError:
                error = AgentTimeoutError(f"agent {agent.name} ran past {timeout:.1f}s")
            except TrialError as e:
                error = e
            timings["agent_execute"] = time.perf_counter() - t
            t = time.perf_counter()
            vr = await self._verify(task, sandbox)
            timings["verifier"] = time.perf_counter() - t
            await self._save_logs(sandbox, traj_dir)
        finally:
            await sandbox.stop()
            if not cfg.keep_sandboxes:
                shutil.rmtree(sandbox_dir, ignore_errors=True)
        exit_reason = result.exit_reason if result else (error.kind.value if isinstance(error, TrialError) else None)
        return (vr.reward if vr else None), (vr.rewards if vr else None), error, exit_reason

    def _make_agent(self) -> Any:
        if self.cfg.agent == "bash":
            return make_agent("bash", max_turns=self.cfg.max_turns, command_timeout_sec=self.cfg.command_timeout_sec,
                              compact=self.cfg.compact_prompt)
        return make_agent(self.cfg.agent)

    async def _verify(self, task: HarborTask, sandbox: Any) -> Any:
        """Upload ``tests/`` to ``/tests`` (only now visible) and run ``test.sh``; parse the reward."""
        await sandbox.upload(task.tests_dir, "/tests")
        timeout = self.cfg.verifier_timeout_sec or task.config.verifier_timeout_sec
        res = await sandbox.exec("bash /tests/test.sh", env=task.config.verifier_env, timeout_sec=timeout)
        (sandbox.host_path("/logs/verifier") / "test-stdout.txt").write_text(res.stdout + res.stderr)
        if res.timed_out:
            logger.warning("verifier of %s timed out after %.1fs", task.name, timeout)
        return read_verifier_result(sandbox.host_path("/logs/verifier"))

    @staticmethod
    async def _save_logs(sandbox: Any, traj_dir: Path) -> None:
        with contextlib.suppress(OSError):
            await sandbox.download("/logs", traj_dir / "logs")

    async def _harbor_trial(self, task: HarborTask, base_url: str, traj_dir: Path, timings: dict) -> tuple:
        """A real Harbor Trial out of process. Returns ``(reward, rewards, error, exit_reason)``."""
        from .harbor_runner import HarborRunner

        runner = HarborRunner(python=self.cfg.harbor_python)
        agent = self.cfg.agent.split(":", 1)[1]
        res = await runner.run_trial(task.path, agent=agent, base_url=base_url, trials_dir=traj_dir,
                                     agent_timeout_sec=self.cfg.agent_timeout_sec,
                                     max_turns=self.cfg.max_turns)
        timings.update({k: v for k, v in res.timings.items() if k in timings})
        return res.reward, res.rewards, res.error, res.agent
