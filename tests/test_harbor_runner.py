"""Real Harbor trials out of process on the local sandbox: oracle -> 1.0, Terminus-2 against the proxy.

Needs the Python >= 3.12 env with ``harbor`` (``scripts/setup_harbor_env.sh``); the Harbor tests
skip with the reason when it is absent. The engine behind the proxy is the scripted fake engine.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from asyncrl.agent_loop.proxy import TrajectoryProxy
from asyncrl.agent_loop.sandbox.harbor_runner import HarborRunner, HarborUnavailableError, harbor_status
from asyncrl.agent_loop.sandbox.loop import SandboxAgentLoop, SandboxLoopConfig
from asyncrl.agent_loop.sandbox.retry import TrialFailedError
from asyncrl.agent_loop.sandbox.task import EXAMPLES_DIR, list_tasks, load_task, task_row
from asyncrl.rollout.base import SamplingParams
from tests.fake_engine import FakeEngine, qwen_test_tokenizer

HARBOR_OK, HARBOR_REASON = harbor_status()
needs_harbor = pytest.mark.skipif(not HARBOR_OK or shutil.which("bwrap") is None,
                                  reason=HARBOR_REASON if not HARBOR_OK else "bubblewrap not installed")
HELLO = load_task(EXAMPLES_DIR / "hello-file")

STEP = json.dumps({"analysis": "The file is missing.", "plan": "Write it.", "task_complete": False,
                   "commands": [{"keystrokes": "echo 'Hello, world!' > /app/hello.txt\n", "duration": 0.2}]})
DONE = json.dumps({"analysis": "Done.", "plan": "Nothing left.", "commands": [], "task_complete": True})


def terminus_script():
    """Fake policy for Terminus-2's JSON protocol: one command, then 'complete' (confirmed twice)."""
    calls = []

    def script(prompt_ids):
        calls.append(1)
        return STEP if len(calls) == 1 else DONE

    return script


def run_swe_loop(engine, tok, cfg: SandboxLoopConfig, task=HELLO, **proxy_kwargs):
    async def go():
        proxy = TrajectoryProxy(engine, tok, "hermes", **proxy_kwargs)
        try:
            loop = SandboxAgentLoop(engine, tok, None, proxy=proxy, sandbox_config=cfg)
            return await loop.run(SamplingParams(max_tokens=512), request_id="harbor-test", **task_row(task))
        finally:
            await proxy.stop()

    return asyncio.run(go())


def test_unavailable_env_reports_how_to_create_it(tmp_path):
    ok, reason = harbor_status(str(tmp_path / "no-such-python"))
    assert not ok and "setup_harbor_env.sh" in reason
    with pytest.raises(HarborUnavailableError, match="setup_harbor_env.sh"):
        asyncio.run(HarborRunner(python=str(tmp_path / "no-such-python")).run_trial(HELLO.path, trials_dir=tmp_path))


@needs_harbor
def test_oracle_agent_scores_one_on_every_example_task(tmp_path):
    runner = HarborRunner()

    async def go():
        sem = asyncio.Semaphore(2)

        async def one(task):
            async with sem:
                return task.name, await runner.run_trial(task.path, agent="oracle", trials_dir=tmp_path / task.name)

        return await asyncio.gather(*[one(t) for t in list_tasks()])

    for name, res in asyncio.run(go()):
        assert res.error is None, (name, res.error)
        assert res.agent_exit_code is None, (name, res)  # the solution ran (session 29: 127, setpriv not found)
        assert res.reward == 1.0, (name, res)
        assert res.timings["verifier"] > 0 and res.timings["total"] >= res.timings["verifier"]


@needs_harbor
def test_a_failing_solution_script_is_reported_not_silent(tmp_path):
    """Harbor's oracle agent records a non-zero solution exit in agent/exit-code.txt and goes on to the
    verifier; the runner's result carries it (it was how a half-built sandbox root showed, session 29)."""
    task = tmp_path / "task"
    shutil.copytree(HELLO.path, task)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho broken >&2\nexit 3\n")
    res = asyncio.run(HarborRunner().run_trial(task, agent="oracle", trials_dir=tmp_path / "trials"))
    assert res.error is None and res.agent_exit_code == 3 and res.reward == 0.0


@needs_harbor
def test_terminus2_against_the_proxy_completes_and_the_proxy_holds_every_turn(tmp_path):
    tok = qwen_test_tokenizer("qwen2.5")
    engine = FakeEngine(tok, terminus_script())
    out = run_swe_loop(engine, tok, SandboxLoopConfig(agent="harbor:terminus-2", trials_dir=str(tmp_path)))
    assert out.reward_score == 1.0
    assert out.extra_fields["sandbox"]["attempts"] == [{"error_kind": None, "error": "", "reward": 1.0}]
    # every model call went through the proxy and every generated token is in the trajectory (mask 1)
    assert len(engine.calls) >= 2
    generated = sum(len(tok.encode(t, add_special_tokens=False)) + 1 for t in [STEP] + [DONE] * (len(engine.calls) - 1))
    assert sum(out.response_mask) == generated
    assert out.prompt_ids == engine.calls[0][1]
    for phase in ("env_setup", "agent_setup", "agent_execute", "verifier", "total"):
        assert out.metrics[f"agent/sandbox/{phase}"] >= 0.0


@needs_harbor
def test_harbor_agent_timeout_maps_to_keep_reward_without_retry(tmp_path):
    tok = qwen_test_tokenizer("qwen2.5")
    engine = FakeEngine(tok, terminus_script(), delay=8.0)  # never answers within the agent timeout
    cfg = SandboxLoopConfig(agent="harbor:terminus-2", trials_dir=str(tmp_path), agent_timeout_sec=3.0)
    out = run_swe_loop(engine, tok, cfg)
    info = out.extra_fields["sandbox"]
    assert [a["error_kind"] for a in info["attempts"]] == ["agent_timeout"]
    assert info["action"] == "keep_reward" and out.reward_score == 0.0


@needs_harbor
def test_harbor_context_length_exceeded_maps_to_zero_reward_without_retry(tmp_path):
    tok = qwen_test_tokenizer("qwen2.5")
    engine = FakeEngine(tok, terminus_script())
    # Terminus-2's first prompt is far longer than 512 tokens: the proxy answers 400
    # context_length_exceeded, LiteLLM and Harbor turn it into ContextLengthExceededError
    out = run_swe_loop(engine, tok, SandboxLoopConfig(agent="harbor:terminus-2", trials_dir=str(tmp_path)),
                       max_model_len=512)
    info = out.extra_fields["sandbox"]
    assert [a["error_kind"] for a in info["attempts"]] == ["context_length_exceeded"]
    assert info["action"] == "zero_reward" and out.reward_score == 0.0 and engine.calls == []


def test_loop_without_harbor_env_fails_the_sample_with_the_reason(tmp_path):
    tok = qwen_test_tokenizer("qwen2.5")
    engine = FakeEngine(tok, ["x"])
    cfg = SandboxLoopConfig(agent="harbor:oracle", harbor_python=str(tmp_path / "no-such-python"), max_retries=0)
    with pytest.raises(TrialFailedError, match="setup_harbor_env.sh"):
        run_swe_loop(engine, tok, cfg)
