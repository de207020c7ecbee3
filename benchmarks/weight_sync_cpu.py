"""CPU weight sync: gloo broadcast vs Ray object refs + vLLM RPC, side by side in one run.

For each model (the embedded tiny model, a ~5.6M and a ~62M-param Qwen2-shaped random model) one
vLLM RolloutReplica is started, then both checkpoint engines (``gloo``, ``cpu_rpc``) push the same float32 weights
``--repeats`` times (after one untimed warm-up sync each, which also forms the gloo group).
Prints the median seconds per full sync, the throughput and the rpc/gloo ratio, and checks that
the replica really serves the new weights (exact checksum of the unfused embedding).

Usage::

    python benchmarks/weight_sync_cpu.py                 # all three models
    python benchmarks/weight_sync_cpu.py --models tiny   # embedded model only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)


def build_big_model(path: str, hidden: int = 512, layers: int = 12, vocab: int = 32768) -> str:
    """A random Qwen2 (tied embeddings, head_dim 64, GQA 4:1) of ~63M parameters."""
    import torch
    import transformers

    cfg = transformers.Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                   num_key_value_heads=max(1, hidden // 256), max_position_embeddings=512,
                                   tie_word_embeddings=True, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(cfg).float().save_pretrained(path)
    return path


def load_weights(path: str):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return [(n, p.detach()) for n, p in model.named_parameters()]


def bench_model(label: str, path: str, repeats: int, bucket_mb: float) -> list[dict]:
    import ray

    from asyncrl.rollout.replica import RolloutReplica
    from asyncrl.sync import get_engine_cls

    t0 = time.perf_counter()
    replica = RolloutReplica("vllm", {"model_path": path, "max_num_seqs": 8, "max_model_len": 256}).wait_ready(timeout=900)
    start_s = time.perf_counter() - t0
    weights = load_weights(path)
    nparams = sum(t.numel() for _, t in weights)
    rows = []
    try:
        for transport in ("gloo", "cpu_rpc"):
            engine = get_engine_cls(transport)([replica], bucket_bytes=int(bucket_mb * (1 << 20)))
            times, sends, version = [], [], 0
            for i in range(repeats + 1):  # first sync is warm-up (group formation, allocator)
                version += 1
                scale = 1.0 + 1e-3 * version  # different bytes every time
                sent = [(n, t * scale) for n, t in weights]
                m = asyncio.run(engine.send_weights(sent, version))
                if i:
                    times.append(m["sync/total_s"])
                    sends.append(m.get("sync/broadcast_s", m.get("sync/pack_s", 0.0)))
            sums = ray.get(replica.actor.param_checksums.remote())
            ok = sums["model.embed_tokens.weight"] == float(dict(sent)["model.embed_tokens.weight"].double().sum())
            ok = ok and replica.param_version() == version
            asyncio.run(engine.shutdown())
            med = statistics.median(times)
            rows.append({"model": label, "params_M": nparams / 1e6, "MB": m["sync/bytes"] / 2**20, "transport": transport,
                         "median_s": med, "min_s": min(times), "send_s": statistics.median(sends), "MB_per_s": m["sync/bytes"] / 2**20 / med,
                         "verified": ok, "engine_start_s": start_s})
    finally:
        replica.shutdown()
        del weights
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,mid,big", help="comma list of: tiny, mid, big")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    args = ap.parse_args()

    import ray

    from asyncrl.config import MODEL_DIR

    for attempt in range(3):  # the raylet's 30 s start deadline can be missed on a loaded 2-core box
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for label in args.models.split(","):
            if label == "tiny":
                path = str(MODEL_DIR)
            elif label == "mid":  # ~5.6M params, 21 MiB: near the crossover
                path = build_big_model(os.path.join(tmp, "mid"), hidden=256, layers=4, vocab=8192)
            else:
                path = build_big_model(os.path.join(tmp, "big"))
            rows += bench_model(label, path, args.repeats, args.bucket_mb)
    ray.shutdown()

    print(f"\nweight sync, 1 vLLM CPU replica, bucket {args.bucket_mb:g} MiB, median of {args.repeats} (after 1 warm-up)")
    print("send s = trainer-side time (gloo: until the last bucket is broadcast; rpc: bucketing + ray.put)")
    print(f"{'model':6} {'params':>8} {'MiB':>8} {'transport':>9} {'median s':>9} {'min s':>8} {'send s':>8} {'MiB/s':>8} verified")
    for r in rows:
        print(f"{r['model']:6} {r['params_M']:7.2f}M {r['MB']:8.1f} {r['transport']:>9} {r['median_s']:9.3f} "
              f"{r['min_s']:8.3f} {r['send_s']:8.3f} {r['MB_per_s']:8.1f} {r['verified']}")
    for label in dict.fromkeys(r["model"] for r in rows):
        by = {r["transport"]: r["median_s"] for r in rows if r["model"] == label}
        print(f"{label}: cpu_rpc / gloo = {by['cpu_rpc'] / by['gloo']:.2f}x")


if __name__ == "__main__":
    main()
