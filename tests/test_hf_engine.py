"""HFEngine with continuous batching: correctness against transformers, the RL hooks, the sampler.

CPU tests check the batched engine token for token against one-by-one transformers decoding
(Qwen2 and Llama architectures), log-probs against a full forward through the shared sampling
transform, and abort / pause / resume / weight-update semantics. ``gpu`` tests run the same
checks with the decode step replayed from CUDA graphs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.hf_backend import HFEngine
from asyncrl.rollout.hf_sampler import sample, seeded_uniforms
from asyncrl.rollout.sampling import apply_sampling_filters
from asyncrl.sync.bucket import iter_buckets

HAS_CUDA = torch.cuda.is_available()
EOS = 2
# prompts of different lengths; ~25 requests for 4 slots exercises queueing and slot reuse
PROMPTS = [[(7 * i + j) % 90 + 3 for j in range(1 + (5 * i) % 13)] for i in range(25)]


def _llama(path: Path) -> Path:
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   tie_word_embeddings=True, eos_token_id=EOS, bos_token_id=1, pad_token_id=0)
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def arch_model_dir(request, random_model_dir, tmp_path_factory) -> Path:
    return random_model_dir if request.param == "qwen2" else _llama(tmp_path_factory.mktemp("llama"))


def _hf(model_dir: Path, device: str = "cpu"):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()


def ref_greedy(model, prompt: list[int], n: int, stops: set[int]) -> list[int]:
    """One request at a time through transformers with its own KV cache (stop id included)."""
    out: list[int] = []
    past, nxt = None, torch.tensor([prompt], device=model.device)
    with torch.no_grad():
        for _ in range(n):
            res = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past, tok = res.past_key_values, int(res.logits[0, -1].argmax())
            out.append(tok)
            if tok in stops:
                break
            nxt = torch.tensor([[tok]], device=model.device)
    return out


def run(engine_kwargs: dict, body):
    """Start an engine, run ``await body(engine)`` on one event loop, shut the engine down."""
    async def main():
        eng = HFEngine(**engine_kwargs)
        await eng.start()
        try:
            return await body(eng)
        finally:
            await eng.shutdown()

    return asyncio.run(main())


async def _gather(eng, prompts, sp, tag="r"):
    return await asyncio.gather(*(eng.generate(f"{tag}{i}", p, sp) for i, p in enumerate(prompts)))


async def _until_active(eng, n: int = 1):
    while eng.batcher.num_active < n:
        await asyncio.sleep(0.005)


# --------------------------------------------------------------------------- batching correctness


def test_batched_greedy_equals_one_by_one(arch_model_dir):
    """4 slots, 30 concurrent requests (some sharing a prompt, prefilled once), chunked prefill:
    every output equals transformers run one request at a time."""
    sp = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[11])
    prompts = PROMPTS + PROMPTS[3:5] * 2 + PROMPTS[3:4]
    outs = run(dict(model_path=str(arch_model_dir), max_num_seqs=4, max_model_len=64, max_prefill_tokens=24),
               lambda eng: _gather(eng, prompts, sp))
    model = _hf(arch_model_dir)
    for p, o in zip(prompts, outs):
        ref = ref_greedy(model, p, 12, {EOS, 11})
        assert o.token_ids == ref
        assert o.stop_reason == ("completed" if ref[-1] in (EOS, 11) else "length")
    assert {o.stop_reason for o in outs} == {"completed", "length"}  # both kinds occur


def test_logprobs_match_full_forward_under_the_shared_filters(random_model_dir):
    """Sampled tokens' log-probs = log_softmax(apply_sampling_filters(full-forward logits)) at those ids."""
    filt = dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.02)
    sps = [SamplingParams(max_tokens=16, seed=i, ignore_eos=True, **filt) for i in range(3)]
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)

    async def body(eng):
        return await asyncio.gather(*(eng.generate(f"s{i}", PROMPTS[i], sp) for i, sp in enumerate(sps)),
                                    eng.generate("g", PROMPTS[3], greedy))

    outs = run(dict(model_path=str(random_model_dir), max_num_seqs=8, max_model_len=64), body)
    model = _hf(random_model_dir)
    for prompt, o, f in zip(PROMPTS, outs, [filt] * 3 + [None]):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + o.token_ids])).logits[0, len(prompt) - 1:-1]
        x = apply_sampling_filters(logits, **f) if f else logits.float()
        ref = torch.log_softmax(x, -1).gather(-1, torch.tensor(o.token_ids)[:, None])[:, 0]
        assert torch.isfinite(ref).all()  # every sampled token is inside the filtered support
        torch.testing.assert_close(torch.tensor(o.log_probs), ref, atol=2e-5, rtol=0)


def test_seeded_request_is_batch_invariant(random_model_dir):
    sp = SamplingParams(max_tokens=10, temperature=1.0, seed=123, ignore_eos=True)

    async def body(eng):
        alone = await eng.generate("alone", PROMPTS[5], sp)
        others = [eng.generate(f"o{i}", p, SamplingParams(max_tokens=10, seed=i)) for i, p in enumerate(PROMPTS[:6])]
        crowd = await asyncio.gather(eng.generate("crowd", PROMPTS[5], sp), *others)
        other_seed = await eng.generate("x", PROMPTS[5], SamplingParams(max_tokens=10, seed=124, ignore_eos=True))
        return alone, crowd[0], other_seed

    alone, crowd, other = run(dict(model_path=str(random_model_dir), max_num_seqs=8, max_model_len=64), body)
    assert alone.token_ids == crowd.token_ids and alone.token_ids != other.token_ids
    np.testing.assert_allclose(alone.log_probs, crowd.log_probs, atol=1e-5)


def test_long_tail_moves_to_the_lowest_slots_and_keeps_its_tokens(random_model_dir):
    """Six short requests in the low slots finish first; the two long ones in slots 6 and 7 move to slots 0
    and 1 (KV rows, position, seed, top log-probs), so the steps after compute 2 rows, not 8, and their
    tokens, log-probs and top log-probs are the ones each long request gets alone."""
    short = SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True)
    long = [SamplingParams(max_tokens=20, temperature=1.0, seed=40 + i, ignore_eos=True, top_logprobs=2) for i in range(2)]
    rows_computed: list[int] = []

    async def body(eng):
        alone = [await eng.generate(f"alone{i}", PROMPTS[10 + i], sp) for i, sp in enumerate(long)]
        decode = eng.batcher.lm.decode
        eng.batcher.lm.decode = lambda tok, pos, kv_len: rows_computed.append(len(tok)) or decode(tok, pos, kv_len)
        crowd = await asyncio.gather(*(eng.generate(f"s{i}", PROMPTS[i], short) for i in range(6)),
                                     *(eng.generate(f"l{i}", PROMPTS[10 + i], sp) for i, sp in enumerate(long)))
        return alone, crowd[6:], eng.batcher.moves

    alone, crowd, moves = run(dict(model_path=str(random_model_dir), max_num_seqs=8, max_model_len=64), body)
    assert moves == 2
    assert rows_computed[0] == 8 and rows_computed[-1] == 2 and rows_computed.count(2) >= 15
    for a, c in zip(alone, crowd):
        assert c.token_ids == a.token_ids and len(c.token_ids) == 20
        np.testing.assert_allclose(c.log_probs, a.log_probs, atol=1e-5)
        assert [[t for t, _ in alts] for alts in c.top_logprobs] == [[t for t, _ in alts] for alts in a.top_logprobs]


def test_length_limits_and_bad_prompts(random_model_dir):
    async def body(eng):
        long = await eng.generate("l", [5] * 60, SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
        zero = await eng.generate("z", [5], SamplingParams(max_tokens=0))
        for bad in ([], [5] * 64):
            with pytest.raises(ValueError, match="max_model_len"):
                await eng.generate("b", bad, SamplingParams())
        return long, zero

    long, zero = run(dict(model_path=str(random_model_dir), max_num_seqs=2, max_model_len=64), body)
    assert len(long.token_ids) == 4 and long.stop_reason == "length"  # prompt + output <= max_model_len
    assert zero.token_ids == [] and zero.stop_reason == "length"


def test_stop_strings_and_top_logprobs_inside_a_batch():
    """A request with stop strings and top logprobs among plain ones gets what it gets alone."""
    from conftest import EMBEDDED_MODEL, embedded_model_ready

    if not embedded_model_ready():
        pytest.skip("embedded model not built")
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    async def body(eng):
        full = await eng.generate("full", PROMPTS[6], greedy)
        text = eng._tokenizer().decode(full.token_ids)
        special = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[text[6:8]], top_logprobs=3)
        crowd = await asyncio.gather(eng.generate("special", PROMPTS[6], special),
                                     *(eng.generate(f"p{i}", p, greedy) for i, p in enumerate(PROMPTS[:8])))
        return full, crowd[0], crowd[1:], await _gather(eng, PROMPTS[:8], greedy, "alone")

    full, special, crowd, alone = run(dict(model_path=str(EMBEDDED_MODEL), max_num_seqs=16, max_model_len=64), body)
    assert special.stop_reason == "completed" and 0 < len(special.token_ids) < 24
    assert special.token_ids == full.token_ids[:len(special.token_ids)]
    assert len(special.top_logprobs) == len(special.token_ids)
    for tid, lp, alts in zip(special.token_ids, special.log_probs, special.top_logprobs):
        assert alts[0][0] == tid and alts[0][1] == pytest.approx(lp, abs=1e-5) and len({a for a, _ in alts}) == 3
    assert [o.token_ids for o in crowd] == [o.token_ids for o in alone] and all(o.top_logprobs is None for o in crowd)


def test_kv_cache_budget_sizes_the_slots(random_model_dir):
    from asyncrl.rollout.hf_forward import StaticCacheLM, num_kv_slots
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(random_model_dir)
    per_slot = StaticCacheLM.kv_bytes_per_slot(cfg, 64, torch.float32)
    assert per_slot == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 32 * 64 * 4
    assert num_kv_slots(cfg, 64, torch.float32, 256, None) == 256
    assert num_kv_slots(cfg, 64, torch.float32, 256, 3.5 * per_slot) == 3
    with pytest.raises(ValueError, match="cpu_kvcache_space_gb"):
        num_kv_slots(cfg, 64, torch.float32, 256, 0.5 * per_slot)
    eng = HFEngine(str(random_model_dir), max_model_len=64, kv_cache_gb=3.5 * per_slot / 2**30)
    asyncio.run(eng.start())
    assert eng.batcher.lm.num_slots == 3


# --------------------------------------------------------------------------- abort / pause / resume


def test_abort_returns_prefix_and_frees_slots(random_model_dir):
    sp = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)

    async def body(eng):
        tasks = [asyncio.create_task(eng.generate(f"a{i}", PROMPTS[i], sp)) for i in range(3)]  # 2 run, 1 queued
        await _until_active(eng, 2)
        while eng.batcher.steps < 3:
            await asyncio.sleep(0.005)
        n = await eng.abort_all_requests()
        outs = await asyncio.gather(*tasks)
        return n, outs, eng.batcher.num_free, eng.num_inflight

    n, outs, free, inflight = run(dict(model_path=str(random_model_dir), max_num_seqs=2, max_model_len=256), body)
    model = _hf(random_model_dir)
    assert n == 3 and all(o.stop_reason == "aborted" for o in outs)
    assert outs[2].token_ids == []  # aborted while queued
    for p, o in zip(PROMPTS, outs[:2]):
        assert 0 < len(o.token_ids) < 200 and len(o.log_probs) == len(o.token_ids)
        assert o.token_ids == ref_greedy(model, p, len(o.token_ids), set())
    assert free == 2 and inflight == 0


@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
def test_pause_modes(random_model_dir, mode):
    """abort: running and queued requests end aborted; wait: running finish; keep: frozen, then resume seamlessly."""
    long = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)

    async def body(eng):
        running = asyncio.create_task(eng.generate("run", PROMPTS[0], long))
        queued = asyncio.create_task(eng.generate("queued", PROMPTS[1], long))  # 1 slot: waits
        await _until_active(eng)
        await eng.pause(mode)
        steps = eng.batcher.steps
        late = asyncio.create_task(eng.generate("late", PROMPTS[2], SamplingParams(max_tokens=3, temperature=0.0)))
        await asyncio.sleep(0.2)
        state = dict(running=running.done(), queued=queued.done(), late=late.done(), stepped=eng.batcher.steps - steps)
        await eng.resume()
        return state, await running, await queued, await late

    state, running, queued, late = run(dict(model_path=str(random_model_dir), max_num_seqs=1, max_model_len=256), body)
    model = _hf(random_model_dir)
    assert not state["late"] and state["stepped"] == 0  # nothing admitted or decoded while paused
    assert len(late.token_ids) == 3
    if mode == "abort":
        assert state["running"] and state["queued"]
        assert running.stop_reason == "aborted" and queued.stop_reason == "aborted" and queued.token_ids == []
        assert running.token_ids == ref_greedy(model, PROMPTS[0], len(running.token_ids), set())
    elif mode == "wait":
        assert state["running"] and not state["queued"]
        assert running.stop_reason == "length" and len(running.token_ids) == 120
    else:  # keep: the frozen request continues after resume as if never paused
        assert not state["running"] and not state["queued"]
        assert running.token_ids == ref_greedy(model, PROMPTS[0], 120, set())
    if mode != "abort":
        assert queued.token_ids == ref_greedy(model, PROMPTS[1], 120, set())


def test_cancelled_caller_frees_its_slot(random_model_dir):
    async def body(eng):
        task = asyncio.create_task(eng.generate("c", PROMPTS[0], SamplingParams(max_tokens=500, ignore_eos=True)))
        await _until_active(eng)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while eng.num_inflight:
            await asyncio.sleep(0.005)
        return eng.batcher.num_free

    assert run(dict(model_path=str(random_model_dir), max_num_seqs=1, max_model_len=600), body) == 1


# --------------------------------------------------------------------------- weights


def _perturbed(model_dir: Path, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(n, p.detach() + 0.3 * torch.randn(p.shape, generator=g)) for n, p in _hf(model_dir).named_parameters()]


def _weight_update_scenario(model_dir: Path, device: str, cuda_graphs: bool):
    """Greedy before, then a weight update while a request is frozen (pause keep), then greedy after."""
    new = _perturbed(model_dir, seed=7)
    sp = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)

    async def body(eng):
        ptrs = {n: p.data_ptr() for n, p in eng.model.named_parameters()}
        before = await _gather(eng, PROMPTS[:4], sp, "b")
        inflight = asyncio.create_task(eng.generate("f", PROMPTS[4], sp))
        while eng.batcher.steps < 2 or not eng.batcher.num_active:
            await asyncio.sleep(0.001)
        await eng.pause("keep")
        await eng.load_weight_buckets(list(iter_buckets(new, 4096)), version=5)
        await eng.resume()
        after = await _gather(eng, PROMPTS[:4], sp, "a")
        same_ptrs = ptrs == {n: p.data_ptr() for n, p in eng.model.named_parameters()}
        live = {n: p.detach().cpu() for n, p in eng.model.named_parameters()}
        return before, after, await inflight, same_ptrs, live, eng.batcher.num_graphs

    before, after, frozen, same_ptrs, live, graphs = run(
        dict(model_path=str(model_dir), device=device, cuda_graphs=cuda_graphs, max_num_seqs=8, max_model_len=128), body)
    old_model = _hf(model_dir, device)
    new_model = _hf(model_dir, device)
    new_model.load_state_dict(dict(new), strict=False)
    assert same_ptrs and all(torch.equal(live[n], t) for n, t in new)  # loaded in place, bit-exact
    assert [o.token_ids for o in before] == [ref_greedy(old_model, p, 40, set()) for p in PROMPTS[:4]]
    assert [o.token_ids for o in after] == [ref_greedy(new_model, p, 40, set()) for p in PROMPTS[:4]]
    assert all(o.response_versions == [5] * 40 for o in after) and all(o.response_versions == [0] * 40 for o in before)
    assert frozen.response_versions[0] == 0 and frozen.response_versions[-1] == 5  # old tokens old, new tokens new
    assert frozen.response_versions == sorted(frozen.response_versions)
    assert frozen.stop_reason == "length" and len(frozen.token_ids) == 40
    return graphs


def test_weight_update_in_place_and_used_by_next_tokens(random_model_dir):
    _weight_update_scenario(random_model_dir, "cpu", cuda_graphs=False)


def test_bad_weight_name_is_refused(random_model_dir):
    async def body(eng):
        with pytest.raises(KeyError, match="does not have"):
            await eng.load_weight_buckets(list(iter_buckets([("nope.weight", torch.zeros(3))], 1024)), version=1)

    run(dict(model_path=str(random_model_dir), max_num_seqs=1, max_model_len=32), body)


# --------------------------------------------------------------------------- sampler


def test_seeded_uniforms_are_deterministic_and_uniform():
    seeds = np.arange(20000, dtype=np.uint64) * np.uint64(2654435761)
    u = seeded_uniforms(seeds, np.zeros(20000, dtype=np.int64))
    assert u.dtype == np.float32 and (u >= 0).all() and (u < 1).all()
    np.testing.assert_array_equal(u, seeded_uniforms(seeds, np.zeros(20000, dtype=np.int64)))
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    hist = np.histogram(u, bins=10, range=(0, 1))[0]
    assert hist.min() > 1800 and hist.max() < 2200
    v = seeded_uniforms(seeds, np.ones(20000, dtype=np.int64))  # next token of the same requests
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.03


def test_sampler_draws_from_the_filtered_distribution():
    """Empirical frequencies over many seeds match softmax(filtered logits); filtered-out ids never drawn."""
    n, vocab = 20000, 12
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(3)).expand(n, vocab) * 2
    params = (0.8, 8, 0.9, 0.0)
    u = torch.from_numpy(seeded_uniforms(np.arange(n, dtype=np.uint64), np.zeros(n, dtype=np.int64)))
    tok, lp, _ = sample(logits, u, torch.zeros(n, dtype=torch.long), (params,), plain=True)
    want = torch.softmax(apply_sampling_filters(logits[:1], *params), -1)[0]
    freq = torch.bincount(tok, minlength=vocab).float() / n
    assert (freq[want == 0] == 0).all()
    assert (freq - want).abs().max() < 0.015
    torch.testing.assert_close(lp, torch.log(want)[tok])
    # greedy rows (group -1) take the argmax and report the raw log-prob
    g_tok, g_lp, _ = sample(logits[:2], u[:2], torch.tensor([-1, 0]), (params,), plain=False)
    assert int(g_tok[0]) == int(logits[0].argmax())
    torch.testing.assert_close(g_lp[0], torch.log_softmax(logits[0], -1).max())


# --------------------------------------------------------------------------- CUDA graphs


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_graph_engine_matches_transformers(arch_model_dir):
    sp = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[11])

    async def body(eng):
        outs = await _gather(eng, PROMPTS, sp)
        return outs, eng.batcher.num_graphs, eng.batcher.cuda_graphs

    outs, graphs, still_graphs = run(dict(model_path=str(arch_model_dir), device="cuda", max_num_seqs=4,
                                          max_model_len=64, max_prefill_tokens=24), body)
    model = _hf(arch_model_dir, "cuda")
    assert graphs > 0 and still_graphs  # decoded from captured graphs, no eager fallback
    assert [o.token_ids for o in outs] == [ref_greedy(model, p, 12, {EOS, 11}) for p in PROMPTS]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_graph_replay_sees_weight_updates(random_model_dir):
    assert _weight_update_scenario(random_model_dir, "cuda", cuda_graphs=True) > 0


# --------------------------------------------------------------------------- benchmark code path


def test_rollout_benchmark_runs_on_cpu(tmp_path):
    """`benchmarks/hf_rollout_cuda.py --device cpu --tiny`: every variant generates the full budget and the
    engine's greedy tokens equal transformers' generate() (float32)."""
    import json
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "hf_rollout_cuda.py"
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, str(bench), "--device", "cpu", "--tiny", "--batch", "8", "--group", "2",
                    "--prompt-len", "12", "--new-tokens", "8", "--threads", "1", "--json", str(out)],
                   check=True, capture_output=True, timeout=600)
    res = json.loads(out.read_text())
    assert set(res["tokens_per_s"]) == {"generate", "generate_static", "kv_loop", "engine"}
    assert not [k for k in res if k.endswith("_error")], res
    assert res["greedy_agreement"] == 1.0 and res["engine_split_s"]["steps"] > 0


# --------------------------------------------------------------------------- end to end


@pytest.mark.e2e
def test_hf_backend_trains_end_to_end(ray_session, tmp_path):
    """`actor_rollout_ref.rollout.name=hf`: mode d (partial rollouts aborted and resumed at every sync) on the
    embedded model; prompt accounting balances and no trained token is older than the staleness bound."""
    from asyncrl.experiment import Experiment
    from asyncrl.recipes import smoke_cpu
    from asyncrl.staleness import sample_budget

    cfg = smoke_cpu("d")
    cfg.actor_rollout_ref.rollout.name = "hf"
    cfg.trainer.default_local_dir = str(tmp_path)
    cfg.trainer.progress_bar = False
    exp = Experiment(cfg)
    try:
        exp.start()
        summary = exp.wait(progress=False)
        versions = ray_session.get(exp.trainer.trained_versions.remote())
        stats = ray_session.get([a.stats.remote() for a in exp.replicas.values()])
    finally:
        exp.stop()
    acc = summary.accounting
    assert acc["balanced"] and acc["failed_total"] == 0, acc
    assert summary.steps == cfg.trainer.total_training_steps
    assert acc["trained"] == summary.steps * sample_budget(cfg).required_samples
    bound = sample_budget(cfg).staleness_bound
    assert versions and all(tv - lo <= bound for tv, lo, hi in versions), (bound, versions)
    assert stats[0]["backend"] == "hf" and stats[0]["weight_updates"] >= summary.param_version > 0


def test_decode_steps_run_on_decode_threads_and_restore_the_process_setting(random_model_dir):
    """CPU decode steps use ``decode_threads`` torch threads; by default (None) one thread for a step under
    DECODE_SERIAL_FLOPS (every step of a tiny model), the process's above it; the caller's setting is restored
    after every step; the config key reaches the engine and a bad value is refused before any engine starts."""
    from asyncrl.config import ConfigError, load_config
    from asyncrl.rollout.backends import engine_kwargs_from_config
    from asyncrl.rollout.hf_backend import DECODE_SERIAL_FLOPS
    from asyncrl.rollout.hf_batch import ContinuousBatcher

    seen: list[int] = []
    step = ContinuousBatcher.step

    def spy(self, *a, **k):
        seen.append(torch.get_num_threads())
        return step(self, *a, **k)

    async def big_model(eng):  # priced as a model whose every step is over the bound
        eng._n_params = int(DECODE_SERIAL_FLOPS)
        return await _gather(eng, PROMPTS[:3], sp)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    ContinuousBatcher.step = spy
    try:
        counts = {}
        for threads, body in ((1, None), (None, None), (2, None), ("auto, large", big_model)):
            seen.clear()
            kw = dict(model_path=str(random_model_dir), max_num_seqs=4, max_model_len=64)
            if not isinstance(threads, str):
                kw["decode_threads"] = threads
            run(kw, body or (lambda eng: _gather(eng, PROMPTS[:3], sp)))
            counts[threads] = set(seen)
            assert torch.get_num_threads() == 2  # restored after every step
    finally:
        ContinuousBatcher.step = step
        torch.set_num_threads(before)
    assert counts == {1: {1}, None: {1}, 2: {2}, "auto, large": {2}}
    with pytest.raises(ValueError, match="decode_threads"):
        HFEngine(model_path=str(random_model_dir), decode_threads=0)
    base = ["actor_rollout_ref.rollout.name=hf"]
    assert "decode_threads" not in engine_kwargs_from_config(load_config(overrides=base))  # the engine's default
    kw = engine_kwargs_from_config(load_config(overrides=base + ["actor_rollout_ref.rollout.engine_kwargs.hf.decode_threads=2"]))
    assert kw["decode_threads"] == 2
    with pytest.raises(ConfigError, match="engine_kwargs.hf.decode_threads=0 is not valid"):
        load_config(overrides=base + ["actor_rollout_ref.rollout.engine_kwargs.hf.decode_threads=0"])
