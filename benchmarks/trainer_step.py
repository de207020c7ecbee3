"""FSDP2 trainer throughput and MFU: Qwen2.5-0.5B shapes at sequence length 4096.

Launch one process per GPU::

    torchrun --nproc_per_node 2 benchmarks/trainer_step.py [--variants mbs=2,ac=0 mbs=4,ac=1,compile=1]
        [--rows 8] [--steps 4] [--profile] [--json out.json]

Each variant builds :class:`asyncrl.trainer.fsdp_engine.FSDPEngine` (random init, bf16 compute,
fp32 master weights and reductions) and times ``train_step`` on ``rows`` sequences per rank of
``seq`` tokens (prompt 256 + response, all real tokens) with a PPO-style loss.

Model FLOPs per sequence (what the model must compute; activation-checkpoint recompute excluded):
``6 * N_matmul * seq`` (q/k/v/o + MLP), ``+ 6 * d * V * (resp + 1)`` (lm_head only on the positions
whose logits are used), ``+ 6 * L * d * seq**2`` (QK^T and AV, fwd + bwd, causal: half of the
``12 * L * d * seq**2`` that PaLM's formula counts).
MFU = model FLOPs / (step time * GPUs * 989.4 TFLOP/s, the H200 SXM dense bf16 datasheet peak);
the same ratio against the bf16 matmul rate measured here is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asyncrl.trainer.fsdp_engine import FSDPEngine, init_distributed  # noqa: E402

PEAK_BF16 = 989.4e12  # H200 SXM dense bf16, NVIDIA datasheet (H100 SXM has the same)


def qwen25_05b_config():
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def model_flops_per_seq(cfg, seq: int, resp: int) -> float:
    """Forward + backward FLOPs of one sequence (see module docstring)."""
    d, L, inter, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    n_mm = L * (2 * d * d + 2 * d * kv + 3 * d * inter)
    return 6 * n_mm * seq + 6 * d * V * (resp + 1) + 6 * L * d * seq * seq


def measured_matmul_tflops(device) -> float:
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - t0) / 1e12


def parse_variant(s: str) -> dict:
    kv = dict(p.split("=") for p in s.split(",") if p)
    return {"mbs": int(kv.get("mbs", 1)), "ac": bool(int(kv.get("ac", 0))), "compile": bool(int(kv.get("compile", 0))),
            "reshard": bool(int(kv.get("reshard", 1))), "fused": bool(int(kv.get("fused", 0))),
            "rows": int(kv["rows"]) if "rows" in kv else None}


def categorise(name: str) -> str:
    n = name.lower()
    for cat, keys in (("nccl (all-gather / reduce-scatter)", ("nccl",)),
                      ("attention (flash / sdpa)", ("flash", "fmha", "attention", "sdpa")),
                      ("matmul (gemm)", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "matmul")),
                      ("softmax / cross-entropy", ("softmax", "nll", "cross_entropy", "log_softmax")),
                      ("optimizer (adam)", ("adam", "fused_adam", "multi_tensor")),
                      ("copy / cast / foreach", ("copy", "cast", "foreach", "to_copy", "chunk_cat", "split_with_sizes")),
                      ("triton fused (compile)", ("triton",)),
                      ("reductions (norm / sum)", ("reduce", "norm")),
                      ("elementwise", ("elementwise", "vectorized", "unrolled", "mul", "add", "silu"))):
        if any(k in n for k in keys):
            return cat
    return "other"


def make_batch(cfg, rows, seq, prompt, device, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (rows, seq), generator=g)
    resp = seq - prompt
    return {"input_ids": ids.to(device), "attention_mask": torch.ones(rows, seq, dtype=torch.long, device=device),
            "response_mask": torch.ones(rows, resp, device=device),
            "old_log_probs": torch.full((rows, resp), -math.log(cfg.vocab_size), device=device),  # ~ratio 1 at init
            "advantages": torch.randn(rows, 1, generator=g).expand(rows, resp).contiguous().to(device)}


def ppo_loss(log_probs, mb, scale, entropy):
    from asyncrl.trainer.losses import agg_loss

    ratio = torch.exp(log_probs - mb["old_log_probs"]).clamp(max=10.0)
    adv = mb["advantages"]
    pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    loss = agg_loss(pg, mb["response_mask"], "token-mean", scale)
    return loss, {"actor/pg_loss": loss.detach()}


def run_variant(cfg, var, args, rank, world, device, profile=False):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    eng = FSDPEngine(cfg, lr=1e-6, micro_batch_size=var["mbs"], activation_checkpointing=var["ac"],
                     compile=var["compile"], reshard_after_forward=var["reshard"],
                     fused_optimizer=var["fused"], seed=0)
    batch = make_batch(cfg, var["rows"] or args.rows, args.seq, args.prompt, device, seed=rank)
    t_first = time.perf_counter()
    for _ in range(args.warmup + int(var["compile"])):  # compiled: AC recompute compiles on step 2
        eng.train_step(batch, ppo_loss)
    t_first = time.perf_counter() - t_first
    ts = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        eng.train_step(batch, ppo_loss)
        torch.cuda.synchronize()
        t = torch.tensor([time.perf_counter() - t0], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ts.append(float(t))
    ts.sort()
    step_s = ts[len(ts) // 2]
    prof_rows = None
    if profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            eng.train_step(batch, ppo_loss)
            torch.cuda.synchronize()
        cats: dict[str, float] = {}
        for ev in prof.key_averages():
            dt = getattr(ev, "self_device_time_total", 0) or getattr(ev, "self_cuda_time_total", 0)
            if dt and ev.device_type.name == "CUDA":
                c = categorise(ev.key)
                cats[c] = cats.get(c, 0.0) + dt / 1e3
        prof_rows = sorted(cats.items(), key=lambda kv: -kv[1])
        if rank == 0 and os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "trainer_profile.txt"), "w") as f:
                f.write(prof.key_averages().table(sort_by="self_device_time_total", row_limit=40))
    peak_mem = torch.cuda.max_memory_allocated() / 2**30
    del eng
    return {"step_s": step_s, "steps_s": ts, "first_steps_s": t_first, "peak_mem_gib": peak_mem, "profile_ms": prof_rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", default=["mbs=1,ac=0", "mbs=2,ac=0", "mbs=4,ac=1", "mbs=2,ac=0,compile=1"])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--rows", type=int, default=8, help="sequences per rank per step")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="profile one step of the best variant")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rank, world, device = init_distributed("nccl")
    cfg = qwen25_05b_config()
    mm = measured_matmul_tflops(device)
    flops_seq = model_flops_per_seq(cfg, args.seq, args.seq - args.prompt)
    flops_step, tokens_step = world * args.rows * flops_seq, world * args.rows * args.seq
    results = []
    for spec in args.variants:
        var = parse_variant(spec)
        r = run_variant(cfg, var, args, rank, world, device)
        rows = var["rows"] or args.rows
        r.update(variant=spec, rows=rows, tokens_per_s=world * rows * args.seq / r["step_s"],
                 mfu=world * rows * flops_seq / r["step_s"] / (world * PEAK_BF16),
                 mfu_vs_measured=world * rows * flops_seq / r["step_s"] / (world * mm * 1e12))
        results.append(r)
        if rank == 0:
            print(f"[{spec}] step {r['step_s']:.3f}s  {r['tokens_per_s']:,.0f} tok/s  MFU {r['mfu']:.1%}  "
                  f"peak mem {r['peak_mem_gib']:.1f} GiB  (first {args.warmup} steps {r['first_steps_s']:.1f}s)", flush=True)
    if args.profile:  # re-run the best variant with the profiler on one step
        best = max(results, key=lambda r: r["mfu"])
        best["profile_ms"] = run_variant(cfg, parse_variant(best["variant"]), args, rank, world, device,
                                         profile=True)["profile_ms"]
    if rank == 0:
        n_all = 494_032_768
        print(f"\ntrainer: Qwen2.5-0.5B shapes, seq {args.seq} (prompt {args.prompt}), {world} GPU(s) x {args.rows} "
              f"rows/step (unless a variant sets rows=), {tokens_step:,} tokens/step, model FLOPs/step {flops_step / 1e12:.1f} T "
              f"(6*N_total*tokens would be {6 * n_all * tokens_step / 1e12:.1f} T)")
        print(f"peak: {PEAK_BF16 / 1e12:.0f} TFLOP/s datasheet dense bf16; measured 8192^3 bf16 matmul here: {mm:.0f} TFLOP/s")
        print(f"{'variant':40s} {'step s':>8s} {'tok/s':>10s} {'MFU':>6s} {'MFU/meas':>8s} {'mem GiB':>8s}")
        for r in results:
            print(f"{r['variant']:40s} {r['step_s']:8.3f} {r['tokens_per_s']:10,.0f} {r['mfu']:6.1%} "
                  f"{r['mfu_vs_measured']:8.1%} {r['peak_mem_gib']:8.1f}")
        best = max(results, key=lambda r: r["mfu"])
        print(f"target MFU >= 35%: best {best['variant']} {best['mfu']:.1%} -> {'MET' if best['mfu'] >= 0.35 else 'NOT MET'}")
        for r in results:
            if r["profile_ms"]:
                tot = sum(v for _, v in r["profile_ms"])
                print(f"profile of one step, {r['variant']} (rank 0 GPU time by kernel class, ms):")
                for k, v in r["profile_ms"]:
                    print(f"  {k:40s} {v:9.1f}  {v / tot:6.1%}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, default=str)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
