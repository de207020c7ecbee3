"""One owner, one name for the parameter version: engine per token -> client -> loop -> batch -> trainer lags.

The engine reports ``TokenOutput.response_versions``; the client carries them across partial-rollout
resumes; every loop fills ``AgentLoopOutput.response_versions``; ``min/max_global_steps`` are derived
in one place; the trainer's lag histogram reads them from the collated ``Batch``. Issue 13 items 5
(sandboxed trajectory without a model turn) and 8 (proxy trajectory lags) are cases here.
"""

from __future__ import annotations

import asyncio
import collections
import json
import shutil

import aiohttp
import pytest
from fake_engine import FakeEngine, qwen_test_tokenizer
from fake_replica import FakeAbortingReplica, FakePool

from asyncrl.agent_loop.base import NO_VERSION, AgentLoopOutput, fill_versions, version_span
from asyncrl.agent_loop.proxy import TrajectoryProxy
from asyncrl.agent_loop.single_turn import SingleTurnAgentLoop
from asyncrl.rollout.base import SamplingParams, TokenOutput
from asyncrl.rollout.client import FullyAsyncLLMServerClient
from asyncrl.staleness import token_lags
from asyncrl.trainer.engine import collate

TOOLS = [{"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}]
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expr": "6*7"}}\n</tool_call>'


def lag_counts(outputs, trainer_version):
    batch = collate(outputs, list(range(len(outputs))))
    return dict(collections.Counter(token_lags(trainer_version, batch.response_versions, batch.response_mask).tolist()))


def test_span_and_fill_rules():
    assert version_span([3, 3, 4, 9], [1, 0, 1, 0]) == (3, 4)  # model tokens only
    assert version_span([5, 5], [0, 0]) == (5, 5)  # no model token: every known version
    assert version_span([NO_VERSION], [0]) is None and version_span([], []) is None
    assert fill_versions([None, 2, None, 3, None]) == [2, 2, 2, 3, 3]
    assert fill_versions([None, None]) == [NO_VERSION, NO_VERSION]


def test_token_output_and_agent_loop_output_refuse_missing_versions():
    with pytest.raises(ValueError, match="response_versions"):
        TokenOutput([1, 2], [0.0, 0.0], "completed")
    with pytest.raises(ValueError, match="response_versions=1"):
        AgentLoopOutput([1], [7, 8], [1, 1], [0.0, 0.0], response_versions=[0])
    out = AgentLoopOutput([1], [7, 8, 9], [1, 0, 1], [-1.0, 0.0, -2.0], response_versions=[2, 2, 3])
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (2, 3)
    empty = AgentLoopOutput([1], [], [], [])
    assert not empty.has_version
    empty.set_version_span(fallback=6)
    assert (empty.extra_fields["min_global_steps"], empty.extra_fields["max_global_steps"]) == (6, 6)


def test_partial_rollout_versions_survive_resumes_into_the_batch():
    """An abort every 5 tokens models a sync: tokens carry 0..7; min/max and lags follow."""
    client = FullyAsyncLLMServerClient(FakePool({"r": FakeAbortingReplica(abort_every=5, natural_len=37)}))
    loop = SingleTurnAgentLoop(client, tokenizer=None, config=None)
    out = asyncio.run(loop.run(SamplingParams(max_tokens=64), request_id="a", prompt_ids=[1, 2]))
    assert out.response_versions == [k // 5 for k in range(37)]
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (0, 7)
    assert lag_counts([out], 7) == {7 - v: 5 for v in range(7)} | {0: 2}


@pytest.mark.parametrize("engine_version,trainer_version", [(0, 0), (2, 3)])
def test_proxy_trajectory_carries_per_token_versions(engine_version, trainer_version):
    """Issue 13.8: an on-policy proxy sample at trainer version 0 records lag 0 for every model token."""
    tok = qwen_test_tokenizer("qwen2.5")
    engine = FakeEngine(tok, [CALL, "It is 42."])
    engine.param_version = engine_version
    proxy = TrajectoryProxy(engine, tok, "hermes")

    async def main():
        async with proxy:
            token, url = await proxy.open_session()
            messages = [{"role": "user", "content": "6*7?"}]
            async with aiohttp.ClientSession() as http:
                for reply in ("42", None):
                    async with http.post(f"{url}/chat/completions",
                                         json={"model": "p", "messages": messages, "tools": TOOLS}) as r:
                        assert r.status == 200
                        messages.append((await r.json())["choices"][0]["message"])
                    if reply:
                        messages.append({"role": "tool", "content": reply, "tool_call_id": "call_0"})
            return await proxy.pop_session(token)

    out = asyncio.run(main()).to_agent_loop_output()
    n_model = sum(out.response_mask)
    assert n_model > 0 and len(out.response_versions) == len(out.response_ids)
    assert set(out.response_versions) == {engine_version}
    assert lag_counts([out], trainer_version) == {trainer_version - engine_version: n_model}
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == engine_version


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_sandboxed_trajectory_without_model_turn_gets_the_engine_version():
    """Issue 13.5: the oracle never calls the model; its trajectory gets the serving version (5), not 0."""
    from asyncrl.agent_loop.sandbox.loop import SandboxAgentLoop, SandboxLoopConfig
    from asyncrl.agent_loop.sandbox.task import EXAMPLES_DIR, load_task, task_row

    tok = qwen_test_tokenizer("qwen2.5")
    engine = FakeEngine(tok, ["unused"])
    engine.param_version = 5

    async def go():
        proxy = TrajectoryProxy(engine, tok, "hermes")
        try:
            loop = SandboxAgentLoop(engine, tok, None, sandbox_config=SandboxLoopConfig(agent="oracle"), proxy=proxy)
            return await loop.run(SamplingParams(max_tokens=16), request_id="r5",
                                  **task_row(load_task(EXAMPLES_DIR / "hello-file")))
        finally:
            await proxy.stop()

    out = asyncio.run(go())
    assert engine.calls == [] and out.response_ids == []
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 5


def test_worker_gives_versionless_trajectories_the_replica_version(model_dir):
    """Any loop (here a custom one) that returns no engine token gets the version its replica serves."""
    from asyncrl.agent_loop.base import AgentLoopBase, register
    from asyncrl.agent_loop.worker import AgentLoopWorker
    from asyncrl.config import ExperimentConfig

    @register("test_no_model_turn")
    class NoModelTurn(AgentLoopBase):
        async def run(self, sampling_params, **sample):
            return AgentLoopOutput(list(sample["prompt_ids"]), [], [], [], reward_score=0.0)

    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.model.path = str(model_dir)
    pool = FakePool({"r": FakeAbortingReplica(version=4)})
    worker = AgentLoopWorker(cfg, pool)
    row = {"agent_name": "test_no_model_turn", "prompt": [], "reward_model": {"ground_truth": "1"}}
    outs = asyncio.run(worker.generate_sequences_single(row, "u", SamplingParams(), 2, prompt_ids=[1, 2]))
    assert [(o.extra_fields["min_global_steps"], o.extra_fields["max_global_steps"]) for o in outs] == [(4, 4)] * 2
    assert pool.inflight["r"] == 0  # the version query released its slot


def test_the_trainer_records_the_updates_in_each_synced_version():
    """The bookkeeping mixin's ``_on_synced`` (updates per version, for ``staleness/update_lag_*``) is the one the
    trainer runs, not FaultTolerantSync's no-op hook (the mixin order lost it once: test_mode_b caught it)."""
    from asyncrl.trainer.bookkeeping import TrainerBookkeeping
    from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer

    assert FullyAsyncTrainer._on_synced is TrainerBookkeeping._on_synced
