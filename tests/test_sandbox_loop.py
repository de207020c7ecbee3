"""SandboxAgentLoop (swe_agent) with the real trajectory proxy and a fake engine; retry policy."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from asyncrl.agent_loop.base import get_agent_loop_cls
from asyncrl.agent_loop.proxy import TrajectoryProxy, normalize_message
from asyncrl.agent_loop.sandbox import loop as loop_module
from asyncrl.agent_loop.sandbox.bash_agent import AgentRunResult
from asyncrl.agent_loop.sandbox.env import SandboxStartError
from asyncrl.agent_loop.sandbox.loop import SandboxAgentLoop, SandboxLoopConfig, sandbox_stats
from asyncrl.agent_loop.sandbox.retry import (Action, AttemptOutcome, ErrorKind, RetryPolicy, TrialFailedError,
                                              classify)
from asyncrl.agent_loop.sandbox.task import EXAMPLES_DIR, task_row, load_task
from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.client import GenerationAborted
from tests.fake_engine import FakeEngine, embedded_tokenizer, qwen_test_tokenizer

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
HELLO = load_task(EXAMPLES_DIR / "hello-file")
OFF_BY_ONE = load_task(EXAMPLES_DIR / "fix-off-by-one")
SP = SamplingParams(max_tokens=256, temperature=1.0)


def call(command: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


def run_loop(engine_script, task=HELLO, tok=None, proxy_kwargs=None, **cfg):
    """Run one swe_agent sample against a fake engine behind the real proxy."""
    tok = tok or qwen_test_tokenizer("qwen2.5")
    engine = FakeEngine(tok, engine_script)

    agent_obj = cfg.pop("agent_obj", None)

    async def go():
        proxy = TrajectoryProxy(engine, tok, "hermes", **(proxy_kwargs or {}))
        try:
            lp = SandboxAgentLoop(engine, tok, None, sandbox_config=SandboxLoopConfig(**cfg), proxy=proxy,
                                  agent=agent_obj)
            out = await lp.run(SP, request_id="r1", **task_row(task))
            return out, lp, engine
        finally:
            await proxy.stop()

    return asyncio.run(go())


# ------------------------------------------------------------------------------------------ retry policy
def test_policy_defaults_and_overrides():
    p = RetryPolicy()
    assert p.action(ErrorKind.AGENT_TIMEOUT) is Action.KEEP_REWARD
    assert p.action(ErrorKind.CONTEXT_LENGTH_EXCEEDED) is Action.ZERO_REWARD
    assert p.action(ErrorKind.AGENT_NONZERO_EXIT) is Action.KEEP_REWARD
    assert p.action(ErrorKind.NO_VERIFIER_RESULT) is Action.RETRY
    assert p.action(ErrorKind.OTHER) is Action.RETRY
    assert RetryPolicy(actions={"agent_timeout": "retry"}).action(ErrorKind.AGENT_TIMEOUT) is Action.RETRY
    with pytest.raises(ValueError, match="unknown error kind"):
        RetryPolicy(actions={"agent_timeot": "retry"})


def test_harbor_exception_names_classify_without_harbor():
    assert classify("AgentTimeoutError") is ErrorKind.AGENT_TIMEOUT
    assert classify("ContextLengthExceededError") is ErrorKind.CONTEXT_LENGTH_EXCEEDED
    assert classify("NonZeroAgentExitCodeError") is ErrorKind.AGENT_NONZERO_EXIT
    assert classify("RewardFileNotFoundError") is ErrorKind.NO_VERIFIER_RESULT
    assert classify(ValueError("x")) is ErrorKind.OTHER

    class ApiError(RuntimeError):  # same name as Harbor's NonZeroAgentExitCodeError subclass
        pass

    assert classify(ApiError()) is ErrorKind.AGENT_NONZERO_EXIT


def test_exhausted_retries_fail_with_reason_never_vanish():
    seen = []

    async def attempt(k):
        seen.append(k)
        return AttemptOutcome(reward=None)  # the verifier never writes a reward

    with pytest.raises(TrialFailedError, match="no_verifier_result") as ei:
        asyncio.run(RetryPolicy(max_retries=2).run(attempt))
    assert seen == [0, 1, 2] and len(ei.value.attempts) == 3


# ------------------------------------------------------------------------------------------ loop
def test_registered_as_swe_agent():
    assert get_agent_loop_cls("swe_agent") is SandboxAgentLoop


def _tokenizer(name):
    if name == "embedded":
        tok = embedded_tokenizer()
        if tok is None:
            pytest.skip("embedded tokenizer not built")
        return tok
    return qwen_test_tokenizer(name)


@pytest.mark.parametrize("tok_name,compact", [("qwen2.5", False), ("qwen3", False), ("embedded", True)])
def test_bash_agent_solves_task_and_proxy_tokens_equal_one_shot_render(tok_name, compact):
    script = [call("echo 'Hello, world!' > /app/hello.txt && cat /app/hello.txt"), "Done."]
    if tok_name == "qwen3":  # Qwen3's template re-renders assistant turns with their <think> block
        script = [f"<think>\nStep {i}.\n</think>\n\n{text}" for i, text in enumerate(script)]
    tok = _tokenizer(tok_name)
    out, lp, engine = run_loop(script, tok=tok, compact_prompt=compact)
    assert out.reward_score == 1.0
    res = lp.last_agent_result
    assert res.exit_reason == "no_tool_call" and res.turns == 2 and res.commands == 1
    assert "Hello, world!" in res.messages[-2]["content"]  # the tool message carried the sandbox output
    assert res.messages[-2]["role"] == "tool" and (res.messages[0]["role"] == "system") != compact
    msgs = [normalize_message(m) for m in res.messages]
    reference = tok.encode(tok.apply_chat_template(msgs, tools=res.tools, tokenize=False), add_special_tokens=False)
    assert out.prompt_ids + out.response_ids == reference
    n_model = sum(len(tok.encode(t, add_special_tokens=False)) + 1 for t in script)  # + EOS each
    assert sum(out.response_mask) == n_model
    assert len(engine.calls) == 2
    for phase in ("env_setup", "agent_setup", "agent_execute", "verifier", "total"):
        assert out.metrics[f"agent/sandbox/{phase}"] >= 0.0
    assert out.metrics["agent/sandbox/total"] >= out.metrics["agent/sandbox/agent_execute"]
    assert out.extra_fields["sandbox"]["attempts"] == [{"error_kind": None, "error": "", "reward": 1.0}]


def test_doing_nothing_scores_zero():
    out, _, _ = run_loop(["I will not do anything."])
    assert out.reward_score == 0.0 and out.metrics["agent/sandbox/attempts"] == 1


class SleepyFakeAgent:
    """Fake agent: solves hello-file, then sleeps past its timeout."""

    name = "sleepy-fake"

    async def run(self, task, sandbox, base_url):
        await sandbox.exec("echo 'Hello, world!' > /app/hello.txt")
        await asyncio.sleep(30)
        return AgentRunResult("no_tool_call")


def test_agent_timeout_no_retry_keeps_verifier_reward():
    out, _, _ = run_loop(["unused"], agent_obj=SleepyFakeAgent(), agent_timeout_sec=0.5)
    info = out.extra_fields["sandbox"]
    assert info["action"] == "keep_reward" and out.reward_score == 1.0
    assert [a["error_kind"] for a in info["attempts"]] == ["agent_timeout"]


class ExitingFakeAgent:
    """Fake agent that exits non-zero without doing anything."""

    name = "exiting-fake"

    async def run(self, task, sandbox, base_url):
        return AgentRunResult("crashed", exit_code=3)


def test_nonzero_exit_no_retry_keeps_reward():
    out, _, _ = run_loop(["unused"], agent_obj=ExitingFakeAgent())
    assert out.reward_score == 0.0 and out.extra_fields["sandbox"]["action"] == "keep_reward"
    assert out.metrics["agent/sandbox/attempts"] == 1


def test_context_length_exceeded_no_retry_reward_zero():
    out, _, _ = run_loop([call("true")], proxy_kwargs={"max_model_len": 50})
    info = out.extra_fields["sandbox"]
    assert out.reward_score == 0.0 and info["action"] == "zero_reward"
    assert [a["error_kind"] for a in info["attempts"]] == ["context_length_exceeded"]


def test_sandbox_start_failing_once_is_retried_then_succeeds(monkeypatch):
    real, calls = loop_module.start_sandbox, []

    async def flaky_start(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise SandboxStartError("fake: could not start")
        return await real(*args, **kwargs)

    monkeypatch.setattr(loop_module, "start_sandbox", flaky_start)
    before = set(Path(tempfile.gettempdir()).glob("asyncrl-sbx-fix-off-by-one-*"))
    out, _, engine = run_loop(["unused"], task=OFF_BY_ONE, agent="oracle")
    attempts = out.extra_fields["sandbox"]["attempts"]
    assert out.reward_score == 1.0 and len(calls) == 2
    assert [a["error_kind"] for a in attempts] == ["other", None]
    assert "could not start" in attempts[0]["error"]
    assert engine.calls == []  # the oracle never calls the model
    assert set(Path(tempfile.gettempdir()).glob("asyncrl-sbx-fix-off-by-one-*")) <= before, "sandbox dirs leaked"


def test_concurrent_sandboxes_are_capped():
    peak = []

    class CountingFakeAgent:
        name = "counting-fake"

        async def run(self, task, sandbox, base_url):
            for _ in range(10):  # long enough for the next sandbox to start even on a loaded machine
                peak.append(sandbox_stats()["active"])
                await asyncio.sleep(0.1)
            return AgentRunResult("no_tool_call")

    tok = qwen_test_tokenizer("qwen2.5")
    engine = FakeEngine(tok, ["x"])

    async def go():
        proxy = TrajectoryProxy(engine, tok, "hermes")
        lp = SandboxAgentLoop(engine, tok, None, proxy=proxy, agent=CountingFakeAgent(),
                              sandbox_config=SandboxLoopConfig(max_concurrent_sandboxes=2))
        try:
            outs = await asyncio.gather(*[lp.run(SP, request_id=f"r{i}", **task_row(HELLO)) for i in range(5)])
        finally:
            await proxy.stop()
        return outs

    outs = asyncio.run(go())
    assert len(outs) == 5 and max(peak) == 2
    stats = sandbox_stats()
    assert stats["active"] == 0 and stats["limit"] == 2 and stats["waiting"] == 0


def test_loop_owned_proxy_serves_concurrent_samples_and_stops_after_the_last():
    tok = qwen_test_tokenizer("qwen2.5")
    first = call("echo 'Hello, world!' > /app/hello.txt")
    engine = FakeEngine(tok, lambda ids: first if "tool_response" not in tok.decode(ids) else "Done.", delay=0.05)

    async def go():
        lp = SandboxAgentLoop(engine, tok, None)  # no proxy, no worker: the loop starts its own
        outs = await asyncio.gather(*[lp.run(SP, request_id=f"own{i}", **task_row(HELLO)) for i in range(3)])
        return outs, lp

    outs, lp = asyncio.run(go())
    assert [o.reward_score for o in outs] == [1.0, 1.0, 1.0]
    assert all(sum(o.response_mask) > 0 for o in outs)
    assert lp._own_proxy is None


def test_loop_reads_its_settings_from_the_experiment_config_section():
    from types import SimpleNamespace

    section = SimpleNamespace(agent="oracle", max_concurrent_sandboxes=3, max_retries=1, unrelated=True)
    config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(
        agent=SimpleNamespace(sandbox=section))))
    lp = SandboxAgentLoop(None, None, config, proxy=object())
    assert (lp.cfg.agent, lp.cfg.max_concurrent_sandboxes, lp.policy.max_retries) == ("oracle", 3, 1)
    assert SandboxAgentLoop(None, None, None, proxy=object()).cfg == SandboxLoopConfig()


def test_configured_action_for_errors_that_raise(monkeypatch):
    async def broken_start(*args, **kwargs):
        raise SandboxStartError("fake: never starts")

    monkeypatch.setattr(loop_module, "start_sandbox", broken_start)
    out, _, _ = run_loop(["unused"], agent="oracle", retry_actions={"other": "zero_reward"})
    info = out.extra_fields["sandbox"]
    assert out.reward_score == 0.0 and info["action"] == "zero_reward" and len(info["attempts"]) == 1
    assert out.response_ids == [] and "never starts" in info["attempts"][0]["error"]
    with pytest.raises(TrialFailedError, match="never starts"):
        run_loop(["unused"], agent="oracle", max_retries=1)


class AbortingFakeEngine(FakeEngine):
    """Fake engine whose requests are aborted by a weight sync while partial_rollout is off."""

    async def generate(self, request_id, prompt_ids, sampling_params):
        self.calls.append((request_id, list(prompt_ids), sampling_params))
        raise GenerationAborted("fake abort during weight sync")


def test_aborted_generation_drops_the_sample_without_retry():
    tok = qwen_test_tokenizer("qwen2.5")
    engine = AbortingFakeEngine(tok, ["unused"])

    async def go():
        proxy = TrajectoryProxy(engine, tok, "hermes")
        try:
            lp = SandboxAgentLoop(engine, tok, None, proxy=proxy, sandbox_config=SandboxLoopConfig(max_retries=2))
            return await lp.run(SP, request_id="abort", **task_row(HELLO))
        finally:
            await proxy.stop()

    with pytest.raises(GenerationAborted):
        asyncio.run(go())
    assert len(engine.calls) == 1


def test_engine_failure_is_retried_with_a_fresh_session():
    tok = qwen_test_tokenizer("qwen2.5")
    script = [call("echo 'Hello, world!' > /app/hello.txt"), "Done."]

    async def go():
        engine = FakeEngine(tok, lambda ids: script[0] if "tool_response" not in tok.decode(ids) else script[1],
                            fail_on=[0])
        proxy = TrajectoryProxy(engine, tok, "hermes")
        try:
            lp = SandboxAgentLoop(engine, tok, None, proxy=proxy)
            return await lp.run(SP, request_id="flaky-engine", **task_row(HELLO)), engine
        finally:
            await proxy.stop()

    out, engine = asyncio.run(go())
    info = out.extra_fields["sandbox"]
    assert out.reward_score == 1.0 and [a["error_kind"] for a in info["attempts"]] == ["other", None]
    assert {c[0] for c in engine.calls} == {"flaky-engine-a0", "flaky-engine-a1"}  # one session per attempt
    assert out.extra_fields["request_id"] == "flaky-engine-a1"
