"""A prompt longer than the engine's context is a counted, reasoned failure of its sample (issue 12).

The engines refuse it with :class:`~asyncrl.rollout.base.PromptTooLong` before submitting (vLLM's own
check raised a bare ``ValueError`` that the proxy answered as a 502 engine error, so a sandboxed agent
retried the trial 3 times and then failed it as ``other``). Now:

- the proxy answers 400 ``context_length_exceeded`` (the bash agent's retry policy: reward 0, no retry),
  also when its ``max_model_len`` is larger than the engine's context;
- a training sample whose agent loop gets it fails with ``PromptTooLong`` as the reason (accounted,
  the run goes on); an evaluation sample is counted under ``eval/failed`` with the same reason.

The rollouter cases run in-process with the fakes of test_rollouter.py; the engine and proxy cases on the
session's real vLLM replica (no engine start of their own).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from conftest import SHARED_REPLICA_MAX_MODEL_LEN
from test_rollouter import FakeGatedReplica, _make, _settle

from asyncrl.rollout.base import PromptTooLong, SamplingParams


class FakeShortContextReplica(FakeGatedReplica):
    """The gated fake replica with an engine context of ``max_model_len`` tokens (refused as the engines do)."""

    def __init__(self, max_model_len: int):
        super().__init__()
        self.max_model_len, self.refused = max_model_len, 0

    async def generate(self, request_id, prompt_ids, sp):
        if len(prompt_ids) >= self.max_model_len:
            self.refused += 1
            raise PromptTooLong(len(prompt_ids), self.max_model_len)
        return await super().generate(request_id, prompt_ids, sp)


def _lengthen(row: dict) -> dict:
    """The row with 13 more prompt tokens (46 rendered instead of 33; data.max_prompt_length is 64)."""
    prompt = [dict(m) for m in row["prompt"]]
    prompt[-1]["content"] += " (x)(x)(x)(x)"
    return {**row, "prompt": prompt}


def test_prompts_longer_than_the_context_fail_their_samples_with_the_reason(ray_session):
    """An engine context of 40 tokens: every third training prompt and one held-out prompt render to 46
    (within data.max_prompt_length, so the rollouter's own check lets them through). Those samples fail
    as PromptTooLong, the others train; the evaluation counts its refused row under eval/failed.
    Nothing stops, every prompt is accounted."""
    async def main():
        cfg, ro, _, q = _make(staleness=3.0)  # max_required_samples 8: room for failures and enqueued ones
        ro.train_rows = [_lengthen(r) if i % 3 == 0 else r for i, r in enumerate(ro.train_rows)]
        ro.val_rows = [_lengthen(r) if i == 1 else r for i, r in enumerate(ro.val_rows[:4])]
        replica = FakeShortContextReplica(40)
        ro.lb.replica = replica
        await ro.start()
        await _settle(ro, lambda: len(q.items) >= 3 and sum(ro.failed.values()) >= 1)
        ev = await ro.evaluate()
        acc = await ro.stop()
        return replica, ev, acc

    replica, ev, acc = asyncio.run(main())
    assert set(acc["failed"]) == {"PromptTooLong"}, acc
    # each failed group had 1 or 2 (n=2) of its trajectories refused; the evaluation 1 (n=1)
    assert acc["failed"]["PromptTooLong"] + 1 <= replica.refused <= 2 * acc["failed"]["PromptTooLong"] + 1
    assert acc["taken"] == acc["enqueued"] + acc["pending"] + sum(acc["dropped"].values()) + sum(acc["failed"].values())
    assert ev["n"] == 3 and ev["eval/failed"] == 1 and ev["eval/failed_reasons"] == {"PromptTooLong": 1}, ev



@pytest.mark.e2e
@pytest.mark.vllm
def test_vllm_refuses_a_prompt_past_its_context_and_the_proxy_answers_context_length_exceeded(shared_replica):
    import ray

    from asyncrl.agent_loop.proxy import TrajectoryProxy
    from asyncrl.models import load_tokenizer
    from asyncrl.rollout.client import FullyAsyncLLMServerClient
    from asyncrl.rollout.load_balancer import LocalRequestLoadBalancer

    n = SHARED_REPLICA_MAX_MODEL_LEN
    with pytest.raises(PromptTooLong) as err:  # typed through Ray (RayTaskError(PromptTooLong))
        ray.get(shared_replica.actor.generate.remote("too-long", [5] * n, SamplingParams(max_tokens=2)))
    assert (err.value.prompt_len, err.value.max_model_len) == (n, n)
    assert len(ray.get(shared_replica.actor.generate.remote("fits", [5] * (n - 2), SamplingParams(
        max_tokens=1, temperature=0.0))).token_ids) == 1

    tok = load_tokenizer()

    async def main():
        client = FullyAsyncLLMServerClient(LocalRequestLoadBalancer({shared_replica.server_id: shared_replica.actor}))
        proxy = TrajectoryProxy(client, tok, max_model_len=4 * n)  # the proxy believes in a longer context
        async with proxy, aiohttp.ClientSession() as http:
            token, url = await proxy.open_session(trajectory_dir=None)
            long = {"messages": [{"role": "user", "content": "1 + " * (n // 3)}], "max_tokens": 2}  # ~4 tokens each
            async with http.post(f"{url}/chat/completions", json=long) as r:
                status, body = r.status, await r.json()
            short = {"messages": [{"role": "user", "content": "1 + 1"}], "max_tokens": 2}
            async with http.post(f"{url}/chat/completions", json=short) as r:  # the session is still usable
                ok = r.status
            traj = await proxy.pop_session(token)
        return status, body, ok, traj

    status, body, ok, traj = asyncio.run(main())
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert "engine's context is 1024" in body["error"]["message"]
    assert ok == 200 and traj.metrics.get("agent/proxy/engine_errors", 0) == 0


@pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="bubblewrap not installed")
def test_a_sandboxed_trial_past_the_engine_context_is_zero_reward_counted_not_retried():
    """The swe pipeline's case: the proxy allows 4096 tokens, the engine's context ends just after the
    first prompt, so the second turn (prompt + tool call + shell output) is refused. Before, the refusal
    was a 502: the bash agent's trial was retried 3 times and the sample failed (``TrialFailedError``).
    Now it is ``context_length_exceeded``: the retry policy's zero reward at once, counted by kind."""
    from fake_engine import FakeEngine, qwen_test_tokenizer
    from test_sandbox_loop import HELLO, SP, call

    from asyncrl.agent_loop.proxy import TrajectoryProxy
    from asyncrl.agent_loop.sandbox.loop import SandboxAgentLoop, SandboxLoopConfig
    from asyncrl.agent_loop.sandbox.task import task_row

    class FakeShortContextEngine(FakeEngine):
        limit = None

        async def generate(self, request_id, prompt_ids, sampling_params):
            self.limit = self.limit or len(prompt_ids) + 8  # the first prompt fits; nothing much longer does
            if len(prompt_ids) >= self.limit:
                raise PromptTooLong(len(prompt_ids), self.limit)
            return await super().generate(request_id, prompt_ids, sampling_params)

    tok = qwen_test_tokenizer("qwen2.5")
    engine = FakeShortContextEngine(tok, [call("echo 'Hello, world!' > /app/hello.txt")])

    async def go():
        proxy = TrajectoryProxy(engine, tok, "hermes", max_model_len=4096)
        try:
            loop = SandboxAgentLoop(engine, tok, None, sandbox_config=SandboxLoopConfig(agent="bash", max_turns=3),
                                    proxy=proxy)
            return await loop.run(SP, request_id="r1", **task_row(HELLO))
        finally:
            await proxy.stop()

    out = asyncio.run(go())
    info = out.extra_fields["sandbox"]
    assert [a["error_kind"] for a in info["attempts"]] == ["context_length_exceeded"], info
    assert info["action"] == "zero_reward" and out.reward_score == 0.0
    assert out.metrics["agent/sandbox/errors/context_length_exceeded"] == 1
    assert len(engine.calls) == 1 and sum(out.response_mask) > 0  # the first turn's tokens are kept
