"""End to end on real parts: the embedded tiny model (transformers HFEngine) behind the trajectory
proxy, the built-in bash agent in the bubblewrap sandbox, the example tasks' verifiers.

The tiny model was trained on arithmetic, so rewards are ~0; the point is the pipeline: every
trial ends with a verifier reward, tokens come from the proxy, masks and lengths are consistent.
"""

from __future__ import annotations

import asyncio
import shutil

import pytest

from asyncrl.agent_loop.proxy import TrajectoryProxy
from asyncrl.agent_loop.sandbox.loop import SandboxAgentLoop, SandboxLoopConfig
from asyncrl.agent_loop.sandbox.task import example_rows
from asyncrl.rollout.base import SamplingParams

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


def test_embedded_model_runs_swe_examples_through_proxy_and_sandbox(tmp_path):
    from asyncrl.models import EMBEDDED_MODEL_DIR, load_tokenizer
    from asyncrl.rollout.hf_backend import HFEngine

    tok = load_tokenizer()
    rows = example_rows(4)

    async def go():
        engine = HFEngine(str(EMBEDDED_MODEL_DIR), seed=0, torch_threads=1)
        await engine.start()
        proxy = TrajectoryProxy(engine, tok, "hermes", max_model_len=512)
        cfg = SandboxLoopConfig(compact_prompt=True, max_turns=2, max_tokens_per_turn=48,
                                trials_dir=str(tmp_path), max_retries=1)
        loop = SandboxAgentLoop(engine, tok, None, proxy=proxy, sandbox_config=cfg)
        try:
            return await asyncio.gather(*[loop.run(SamplingParams(max_tokens=48, temperature=1.0),
                                                   request_id=f"e2e{i}", **row) for i, row in enumerate(rows)])
        finally:
            await proxy.stop()

    outs = asyncio.run(go())
    for row, out in zip(rows, outs):
        out.validate()
        info = out.extra_fields["sandbox"]
        assert info["task"] == row["extra_info"]["task_name"]
        assert 0.0 <= out.reward_score <= 1.0
        assert len(out.prompt_ids) > 0 and sum(out.response_mask) > 0, "the model's tokens come from the proxy"
        assert out.prompt_ids[:3] == tok.encode("<|im_start|>system", add_special_tokens=False)[:3]
        assert all(lp < 0.0 for m, lp in zip(out.response_mask, out.response_logprobs) if m == 1)
        assert out.metrics["agent/sandbox/verifier"] > 0.0
