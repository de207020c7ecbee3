"""Rollout throughput of the hf backend (:class:`asyncrl.rollout.hf_backend.HFEngine`) vs transformers.

Measures, in one process and one run, generated tokens per second of

- ``generate``: warm plain ``model.generate()`` (dynamic KV cache), sampling at temperature 1;
- ``generate_static``: the same with ``cache_implementation="static"`` (reference; ``disable_compile``:
  transformers' auto ``torch.compile`` of a static cache costs minutes and its CUDA graphs break here);
- ``kv_loop``: a plain batched torch KV-cache loop (the ``rlproto`` reference's sampler);
- ``engine``: HFEngine (continuous batching, static slot KV cache, CUDA-graph decode on CUDA),
  every request through the async ``generate()`` API with its own seed, ``ignore_eos``;
- ``engine_eager``: HFEngine with ``cuda_graphs=False`` (CUDA only: what the graphs buy).

Default workload (issue 9, item 4): a Qwen2.5-0.5B-shaped model (random init, bf16; hidden 896,
24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings), batch 256,
256-token prompts, 256 new tokens. Every timed variant is warmed up first with the same shapes.

    python benchmarks/hf_rollout_cuda.py                          # CUDA, the 0.5B shape
    python benchmarks/hf_rollout_cuda.py --device cpu --tiny      # the same code path, tiny model
    python benchmarks/hf_rollout_cuda.py --device cpu --model asyncrl/models/tiny_qwen2_arith \\
        --prompt-len 20 --new-tokens 24 --group 8 --threads 2 --variants kv_loop,engine  # the CPU demo shape

Imports only torch / transformers / numpy and asyncrl's hf backend (no Ray, vLLM, omegaconf or zmq).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncrl.rollout.base import SamplingParams  # noqa: E402
from asyncrl.rollout.hf_backend import HFEngine  # noqa: E402

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6)
LOOPS: dict[HFEngine, asyncio.AbstractEventLoop] = {}
"""The event loop each benchmarked engine lives on."""
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=512, tie_word_embeddings=True, max_position_embeddings=2048)


def build_model(args: argparse.Namespace, workdir: str) -> str:
    """The model directory the engine loads (random init unless ``--model``)."""
    import transformers

    if args.model:
        return args.model
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(**(TINY if args.tiny else QWEN25_05B), eos_token_id=2, bos_token_id=1, pad_token_id=0)
    model = transformers.Qwen2ForCausalLM(cfg).to(getattr(torch, args.dtype))
    path = os.path.join(workdir, "model")
    model.save_pretrained(path)
    return path


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], int]) -> tuple[float, int]:
    sync(device)
    t0 = time.perf_counter()
    tokens = fn()
    sync(device)
    return time.perf_counter() - t0, tokens


def hf_generate(model: Any, prompts: torch.Tensor, new: int, static: bool) -> int:
    kw: dict[str, Any] = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                              pad_token_id=0, attention_mask=torch.ones_like(prompts))
    if static:  # no torch.compile (transformers would auto-compile a static cache on CUDA: minutes)
        kw.update(cache_implementation="static", disable_compile=True)
    with torch.no_grad():
        out = model.generate(prompts, **kw)
    return (out.shape[1] - prompts.shape[1]) * out.shape[0]


def kv_loop(model: Any, prompts: torch.Tensor, new: int) -> int:
    """Batched sampling with a plain transformers KV cache (what rlproto's generate() does)."""
    with torch.no_grad():
        out = model(input_ids=prompts, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
        pos = torch.full((prompts.shape[0], 1), prompts.shape[1], device=prompts.device)
        for _ in range(new):
            probs = torch.softmax(logits.float(), -1)
            nxt = torch.multinomial(probs, 1)
            out = model(input_ids=nxt, position_ids=pos, past_key_values=past, use_cache=True)
            past, logits, pos = out.past_key_values, out.logits[:, -1], pos + 1
    return prompts.shape[0] * new


def engine_run(engine: HFEngine, prompts: list[list[int]], new: int, tag: str) -> int:
    async def go() -> int:
        sp = [SamplingParams(max_tokens=new, temperature=1.0, ignore_eos=True, seed=i) for i in range(len(prompts))]
        outs = await asyncio.gather(*(engine.generate(f"{tag}-{i}", p, s) for i, (p, s) in enumerate(zip(prompts, sp))))
        bad = [o for o in outs if len(o.token_ids) != new or o.stop_reason != "length"]
        if bad:
            raise AssertionError(f"{len(bad)} requests did not generate {new} tokens: {bad[0].stop_reason}")
        return sum(len(o.token_ids) for o in outs)

    return LOOPS[engine].run_until_complete(go())


def start_engine(path: str, args: argparse.Namespace, graphs: bool) -> HFEngine:
    engine = HFEngine(path, dtype=args.dtype, device=args.device, max_num_seqs=args.batch,
                      max_model_len=args.prompt_len + args.new_tokens, cuda_graphs=graphs)
    LOOPS[engine] = asyncio.new_event_loop()  # one loop for the engine's life (as in a Ray actor)
    LOOPS[engine].run_until_complete(engine.start())
    return engine


def greedy_agreement(engine: HFEngine, model: Any, prompts: list[list[int]], n: int) -> float:
    """Fraction of the first ``n`` greedy tokens where the engine equals transformers ``generate``."""
    async def go() -> list[list[int]]:
        sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        return [o.token_ids for o in await asyncio.gather(*(engine.generate(f"g{i}", p, sp) for i, p in enumerate(prompts)))]

    got = LOOPS[engine].run_until_complete(go())
    ids = torch.tensor(prompts, device=engine.device)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0)[:, ids.shape[1]:].tolist()
    agree = 0
    for a, b in zip(got, ref):  # count the matching prefix: after one difference the contexts differ
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), n)
        agree += k
    return agree / (n * len(prompts))


def reference_agreement(model: Any, prompts: list[list[int]], n: int) -> float:
    """The same measure between transformers itself batched and one prompt at a time (the bf16 noise floor)."""
    ids = torch.tensor(prompts, device=model.device)
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        batched = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)[:, ids.shape[1]:].tolist()
        alone = [model.generate(ids[i:i + 1], attention_mask=torch.ones_like(ids[i:i + 1]), **kw)[0, ids.shape[1]:].tolist()
                 for i in range(len(prompts))]
    return sum(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), n) for a, b in zip(batched, alone)) / (n * len(prompts))


def profile_decode(batcher: Any, top: int = 15) -> str:
    """Kernel table of one decode step at the largest captured shape, run eagerly under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn = batcher._decode_fn(*max(batcher._graphs, key=lambda k: (k[0], k[1])))
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_ms = sum(e.device_time for e in kernels) / 1000
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=top, max_name_column_width=60)
    return f"{len(kernels)} kernels, {busy_ms:.3f} ms of device time in one eager decode step\n{table}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny random Qwen2 (CPU smoke of the code path)")
    ap.add_argument("--model", default=None, help="an HF model directory instead of the random 0.5B shape")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (CPU)")
    ap.add_argument("--group", type=int, default=1, help="samples per distinct prompt (GRPO's rollout.n)")
    ap.add_argument("--variants", default="generate,generate_static,kv_loop,engine,engine_eager")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--profile", action="store_true", help="print the kernel table of one decode step (CUDA)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    variants = args.variants.split(",")
    if device.type != "cuda" and "engine_eager" in variants:
        variants.remove("engine_eager")  # identical to `engine` without CUDA

    import transformers

    results: dict[str, Any] = {"args": vars(args), "torch": torch.__version__, "transformers": transformers.__version__,
                               "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(args, tmp)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(device).eval()
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(1)
        prompts = torch.randint(3, vocab, (args.batch // args.group, args.prompt_len), generator=g)
        prompts = prompts.repeat_interleave(args.group, 0)  # GRPO: `group` samples of each prompt
        prompts_dev = prompts.to(device)
        total = args.batch * args.new_tokens
        rows: list[tuple[str, float, int]] = []

        def record(name: str, fn: Callable[[], int], warm: Callable[[], Any]) -> None:
            try:
                warm()
                secs, tokens = timed(device, fn)
                assert tokens == total, (name, tokens, total)
                rows.append((name, secs, tokens))
                print(f"{name:>16}: {tokens / secs:10.0f} tokens/s  ({tokens} tokens in {secs:.2f} s)", flush=True)
            except Exception as exc:  # one failing variant must not lose the others' numbers
                results[f"{name}_error"] = repr(exc)[:500]
                print(f"{name:>16}: FAILED {exc!r}"[:400], flush=True)

        short = max(2, args.new_tokens // 8)
        if "generate" in variants:
            record("generate", lambda: hf_generate(model, prompts_dev, args.new_tokens, False),
                   lambda: hf_generate(model, prompts_dev, args.new_tokens, False))
        if "generate_static" in variants:
            record("generate_static", lambda: hf_generate(model, prompts_dev, args.new_tokens, True),
                   lambda: hf_generate(model, prompts_dev, args.new_tokens, True))
        if "kv_loop" in variants:
            record("kv_loop", lambda: kv_loop(model, prompts_dev, args.new_tokens),
                   lambda: kv_loop(model, prompts_dev, short))
        plist = prompts.tolist()
        for name in ("engine_eager", "engine"):  # eager first: a failed graph capture cannot spoil it
            if name not in variants:
                continue
            engine = start_engine(path, args, graphs=name == "engine")
            record(name, lambda: engine_run(engine, plist, args.new_tokens, "t"),
                   lambda: engine_run(engine, plist, args.new_tokens, "w"))
            b = engine.batcher
            results[f"{name}_cuda_graphs"] = b.num_graphs
            results[f"{name}_split_s"] = dict(prefill=b.prefill_s, decode=b.decode_s, steps=b.steps)
            print(f"{'':>16}  over warm-up + timed run: prefill {b.prefill_s:.2f} s, {b.steps} decode steps "
                  f"{b.decode_s:.2f} s ({1000 * b.decode_s / max(b.steps, 1):.2f} ms/step), CUDA graphs: {b.num_graphs}")
            if name == "engine" and b.num_graphs:  # the decode graph alone: device time per step, no host work
                graph = b._graphs[max(b._graphs, key=lambda k: (k[0], k[1]))][0]
                secs, _ = timed(device, lambda: [graph.replay() for _ in range(50)] and 0)
                results["graph_replay_ms"] = 1000 * secs / 50
                print(f"{'':>16}  largest decode graph replayed alone: {results['graph_replay_ms']:.3f} ms/step")
            if name == "engine" and b.num_graphs and args.profile:
                try:
                    results["decode_profile"] = profile_decode(b)
                    print(results["decode_profile"])
                except Exception as exc:
                    results["decode_profile_error"] = repr(exc)[:500]
                    print(f"profile failed: {exc!r}")
            if name == "engine":
                try:
                    results["greedy_agreement"] = greedy_agreement(engine, model, plist[:8], 32)
                    results["greedy_agreement_generate_batched_vs_alone"] = reference_agreement(model, plist[:8], 32)
                    print(f"greedy agreement with generate() (first 32 tokens, 8 prompts, {args.dtype}): "
                          f"{results['greedy_agreement']:.3f}; generate() batched vs one at a time: "
                          f"{results['greedy_agreement_generate_batched_vs_alone']:.3f}")
                except Exception as exc:
                    results["greedy_agreement_error"] = repr(exc)[:500]
            LOOPS[engine].run_until_complete(engine.shutdown())
            LOOPS.pop(engine).close()
            if device.type == "cuda":
                torch.cuda.empty_cache()

    rate = {name: tokens / secs for name, secs, tokens in rows}
    results["tokens_per_s"] = rate
    for base in ("generate", "generate_static", "kv_loop", "engine_eager"):
        if "engine" in rate and base in rate:
            results[f"engine_vs_{base}"] = rate["engine"] / rate[base]
            print(f"engine / {base}: {rate['engine'] / rate[base]:.2f}x")
    if device.type == "cuda":
        results["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
