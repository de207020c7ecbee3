"""VLLMEngine through the session's shared RolloutReplica: token-in-token-out, abort, pause, weight sync.

Correctness is checked against transformers on the same weights (greedy ids, per-token logprobs).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from asyncrl.rollout.base import SamplingParams

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 6, 7, 8], [10, 11, 12], [3, 20, 21, 22, 23, 9]]


def _hf(model_dir):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _eos(replica) -> list[int]:
    import ray

    return ray.get(replica.actor.__ray_call__.remote(lambda self: self.engine.eos_token_ids))


def hf_greedy(model, prompt: list[int], n: int, eos: list[int]) -> list[int]:
    """Greedy continuation with KV cache, stopping after an EOS id (included, as vLLM does)."""
    out: list[int] = []
    past, nxt = None, torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            res = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past = res.past_key_values
            tok = int(res.logits[0, -1].argmax())
            out.append(tok)
            if tok in eos:
                break
            nxt = torch.tensor([[tok]])
    return out


def hf_logprobs(model, prompt: list[int], ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


def _greedy_all(replica, tag: str, n: int = 16) -> list[list[int]]:
    import ray

    refs = [replica.generate_async(f"{tag}-{i}", p, SamplingParams(max_tokens=n, temperature=0.0)) for i, p in enumerate(PROMPTS)]
    return [o.token_ids for o in ray.get(refs)]


def test_generate_ids_and_logprobs(shared_replica):
    out = shared_replica.generate("gen-0", PROMPTS[0], SamplingParams(max_tokens=12, temperature=1.0, seed=3))
    assert 0 < len(out.token_ids) <= 12
    assert out.log_probs is not None and len(out.log_probs) == len(out.token_ids)
    assert all(lp <= 0.0 for lp in out.log_probs)
    assert out.stop_reason in ("completed", "length")
    no_lp = shared_replica.generate("gen-1", PROMPTS[0], SamplingParams(max_tokens=4, logprobs=False))
    assert no_lp.log_probs is None


def test_greedy_matches_transformers(shared_replica, model_dir):
    hf, eos = _hf(model_dir), _eos(shared_replica)
    got = _greedy_all(shared_replica, "greedy")
    assert got == [hf_greedy(hf, p, 16, eos) for p in PROMPTS]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_transformers(shared_replica, model_dir, temperature):
    hf = _hf(model_dir)
    out = shared_replica.generate(f"lp-{temperature}", PROMPTS[2], SamplingParams(max_tokens=16, temperature=temperature, seed=1))
    ref = hf_logprobs(hf, PROMPTS[2], out.token_ids, temperature)
    torch.testing.assert_close(torch.tensor(out.log_probs), ref, atol=2e-4, rtol=0)


def _wait_inflight(replica, n: int, timeout: float = 30.0) -> None:
    """Block until ``n`` requests are inside the engine, then let them produce a few tokens."""
    deadline = time.monotonic() + timeout
    while replica.num_inflight() < n and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # a warm engine makes ~300 tokens/s per request on the tiny model: partial, not done


def _long_requests(replica, tag: str, n: int = 6, max_tokens: int = 400) -> list:
    sp = SamplingParams(max_tokens=max_tokens, temperature=1.0, ignore_eos=True)
    refs = [replica.generate_async(f"{tag}-{i}", PROMPTS[i % 3], sp) for i in range(n)]
    _wait_inflight(replica, n)
    return refs


def test_abort_returns_partial_tokens(shared_replica):
    import ray

    refs = _long_requests(shared_replica, "abort")
    n = shared_replica.abort_all_requests()
    outs = ray.get(refs, timeout=60)
    aborted = [o for o in outs if o.stop_reason == "aborted"]
    assert n >= len(aborted) >= 1
    assert any(0 < len(o.token_ids) < 400 for o in aborted)
    assert all(len(o.token_ids) == len(o.log_probs) for o in outs)
    assert shared_replica.num_inflight() == 0


def test_pause_abort_then_resume(shared_replica):
    import ray

    refs = _long_requests(shared_replica, "pause")
    shared_replica.pause("abort")
    outs = ray.get(refs, timeout=60)
    assert any(o.stop_reason == "aborted" for o in outs)
    queued = shared_replica.generate_async("while-paused", PROMPTS[0], SamplingParams(max_tokens=4, temperature=0.0))
    ready, _ = ray.wait([queued], timeout=1.5)
    assert not ready, "a request submitted while paused must wait for resume"
    shared_replica.resume()
    out = ray.get(queued, timeout=60)
    assert out.stop_reason in ("completed", "length") and len(out.token_ids) > 0


def test_pause_keep_freezes_and_continues(shared_replica):
    import ray

    ref = shared_replica.generate_async("keep", PROMPTS[1], SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
    _wait_inflight(shared_replica, 1)
    shared_replica.pause("keep")
    ready, _ = ray.wait([ref], timeout=1.0)
    frozen = not ready
    shared_replica.resume()
    out = ray.get(ref, timeout=120)
    assert frozen, "pause(keep) must freeze the request"
    assert out.stop_reason == "length" and len(out.token_ids) == 400  # kept, not aborted


def _perturbed(hf, seed: int, dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    with torch.no_grad():
        for name, p in hf.named_parameters():
            new = (p + 0.5 * p.std().clamp_min(0.05) * torch.randn(p.shape, generator=g)).to(dtype)
            p.copy_(new.float())  # the reference sees exactly what the engine receives
            out.append((name, new))
    return out


@pytest.mark.parametrize("transport,dtype", [("gloo", torch.bfloat16), ("cpu_rpc", torch.float32)])
def test_sync_perturbed_weights_matches_transformers(shared_replica, model_dir, transport, dtype):
    import ray

    from asyncrl.sync import get_engine_cls

    hf, eos = _hf(model_dir), _eos(shared_replica)
    original = [(n, p.detach().clone()) for n, p in hf.named_parameters()]
    before = _greedy_all(shared_replica, f"before-{transport}")
    sent = _perturbed(hf, seed=11, dtype=dtype)
    engine = get_engine_cls(transport)([shared_replica], bucket_bytes=4093)  # odd size: tensors span buckets
    try:
        metrics = asyncio.run(engine.send_weights(sent, version=7))
        assert metrics["sync/total_s"] > 0
        assert shared_replica.param_version() == 7
        after = _greedy_all(shared_replica, f"after-{transport}")
        assert after == [hf_greedy(hf, p, 16, eos) for p in PROMPTS]
        assert after != before
        assert shared_replica.generate("v", PROMPTS[0], SamplingParams(max_tokens=1)).response_versions == [7]
        sums = ray.get(shared_replica.actor.param_checksums.remote())
        ref = {n: float(t.float().double().sum()) for n, t in sent}
        for name in ("model.embed_tokens.weight", "model.norm.weight"):  # unfused names: exact
            assert sums[name] == ref[name]
    finally:
        asyncio.run(engine.send_weights(original, version=0))
        asyncio.run(engine.shutdown())
    assert _greedy_all(shared_replica, f"restored-{transport}") == before


def test_replica_stats(shared_replica):
    stats = shared_replica.stats()
    assert stats["backend"] == "vllm" and stats["num_inflight"] == 0
    assert stats["requests"] >= 1 and stats["generated_tokens"] >= 1


def _set_stream(replica, on: bool) -> bool:
    import ray

    def swap(actor, value):
        old, actor.engine.stream_outputs = actor.engine.stream_outputs, value
        return old

    return ray.get(replica.actor.__ray_call__.remote(swap, on))


def test_final_only_outputs_equal_streamed_ones(shared_replica):
    """One output per request at its end (the default) returns what a per-token stream does: ids, logprobs,
    versions, also for a request aborted part-way."""
    import ray

    sp = SamplingParams(max_tokens=12, temperature=1.0, seed=5)
    was = _set_stream(shared_replica, True)
    try:
        streamed = shared_replica.generate("fo-stream", PROMPTS[2], sp)
        _set_stream(shared_replica, False)
        final = shared_replica.generate("fo-final", PROMPTS[2], sp)
        refs = _long_requests(shared_replica, "fo-abort", n=2)
        shared_replica.abort_all_requests()
        aborted = ray.get(refs, timeout=60)
    finally:
        _set_stream(shared_replica, was)
    assert final.token_ids == streamed.token_ids and final.stop_reason == streamed.stop_reason
    torch.testing.assert_close(torch.tensor(final.log_probs), torch.tensor(streamed.log_probs), atol=1e-6, rtol=0)
    assert final.response_versions == streamed.response_versions and len(set(final.response_versions)) == 1
    assert any(o.stop_reason == "aborted" and 0 < len(o.token_ids) < 400 for o in aborted)
    assert all(len(o.token_ids) == len(o.log_probs) == len(o.response_versions) for o in aborted)


def test_rollout_engine_kwargs_vllm_reach_the_engine_args():
    """verl's ``actor_rollout_ref.rollout.engine_kwargs.vllm``: passed to vLLM's ``AsyncEngineArgs`` as they are and
    winning over the keys asyncrl derives; a field vLLM does not have is its error at start, before any process."""
    from asyncrl.config import load_config
    from asyncrl.recipes import arith_grpo_cpu
    from asyncrl.rollout.replica import engine_kwargs_from_config
    from asyncrl.rollout.vllm_backend import VLLMEngine

    cfg = load_config(base=arith_grpo_cpu(), overrides=[
        "actor_rollout_ref.rollout.engine_kwargs.vllm={max_num_batched_tokens: 4096, enable_prefix_caching: true}"])
    kw = engine_kwargs_from_config(cfg)
    assert kw["engine_kwargs"] == {"enable_prefix_caching": True, "max_num_batched_tokens": 4096}
    assert engine_kwargs_from_config(arith_grpo_cpu())["engine_kwargs"] == {"enable_prefix_caching": False}
    engine = VLLMEngine(kw["model_path"], engine_kwargs={"no_such_engine_field": 1}, warmup=False)
    with pytest.raises(TypeError, match="no_such_engine_field"):
        asyncio.run(engine.start())


def test_keep_mode_configs_stream_outputs():
    from asyncrl.config import ExperimentConfig
    from asyncrl.rollout.replica import engine_kwargs_from_config

    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.rollout.name = "vllm"
    assert engine_kwargs_from_config(cfg)["stream_outputs"] is False
    cfg.async_training.partial_rollout_mode = "keep"  # frozen requests span a sync: versions need the stream
    assert engine_kwargs_from_config(cfg)["stream_outputs"] is True


def test_a_request_queued_during_a_sync_carries_the_version_it_resumes_with(shared_replica):
    """Final-only outputs: a request submitted while the engine is paused for a sync (a partial rollout's
    resubmission) is generated by the weights it resumes with, and labelled with their version."""
    import ray

    def set_version(actor, v):
        old, actor.engine.param_version = actor.engine.param_version, v
        return old

    was = _set_stream(shared_replica, False)
    shared_replica.pause("abort")
    try:
        queued = shared_replica.generate_async("queued-at-sync", PROMPTS[0], SamplingParams(max_tokens=4, temperature=0.0))
        time.sleep(0.2)
        old = ray.get(shared_replica.actor.__ray_call__.remote(set_version, 41))  # as a sync would, before resume
    finally:
        shared_replica.resume()
    try:
        out = ray.get(queued, timeout=60)
        assert out.response_versions == [41] * len(out.token_ids) and out.token_ids
    finally:
        ray.get(shared_replica.actor.__ray_call__.remote(set_version, old))
        _set_stream(shared_replica, was)


def _worker_cpu_s(actor_pid: int) -> float:
    """CPU seconds so far of the vLLM worker processes under the replica actor (``/proc``; Linux)."""
    import os

    def ancestors(pid: str) -> set[int]:
        seen = set()
        while pid not in ("0", "1") and int(pid) not in seen:
            seen.add(int(pid))
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                break
            pid = stat[stat.rindex(")") + 2:].split()[1]
        return seen

    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if not open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"VLLM::Worker") or actor_pid not in ancestors(pid):
                continue
            rest = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    return total


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_the_worker_sleeps_soon_after_a_generation(shared_replica):
    """``rollout.engine_busy_loop_s`` (0.1 s): vLLM's worker polls for its next step (``sched_yield`` in a loop)
    for 1 s after its last one, which on a CPU box took a core from the colocated update (1.3-1.5x slower, session
    16); set shorter, it sleeps on its socket soon after a generation ends."""
    import os

    import ray

    actor_pid = ray.get(shared_replica.actor.__ray_call__.remote(lambda self: os.getpid()))
    assert ray.get(shared_replica.actor.__ray_call__.remote(lambda self: self.engine.busy_loop_s)) == 0.1
    shared_replica.generate("busy-loop", PROMPTS[0], SamplingParams(max_tokens=8, temperature=0.0))
    before = _worker_cpu_s(actor_pid)
    time.sleep(0.8)
    spent = _worker_cpu_s(actor_pid) - before
    assert spent < 0.3, f"the vLLM worker spent {spent:.2f} CPU s in the 0.8 s after a generation (spinning)"
