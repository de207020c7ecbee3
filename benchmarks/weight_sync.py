"""Weight-sync bandwidth between two GPUs: our NCCL engine vs raw NCCL broadcast vs P2P copy.

One run, same GPUs, same bytes: a Qwen2.5-7B-shaped bf16 parameter set (hidden 3584, 28 layers,
28 heads / 4 kv heads of 128, intermediate 18944, vocab 152064, untied lm_head; random values)
lives on GPU 0 (trainer rank 0) and is synced into a same-shaped set on GPU 1 (rollout worker):

* ``p2p``: ``dst.copy_(src)`` of one flat buffer from GPU 0 to GPU 1 (the link's ceiling),
* ``nccl_flat``: one NCCL broadcast of one flat buffer (what NCCL gives without packing),
* ``engine``: :class:`asyncrl.sync.nccl_engine.NCCLCheckpointEngine` with bucket sizes
  256 MB / 1 GB / 2 GB: pack -> broadcast -> unpack into the receiver's tensors, acked,
* ``pack``: packing alone on GPU 0 (the sender-side overhead the double buffer hides).

Every engine round is checked bit-exact on the receiver. GB/s are 1e9 bytes/s of payload.

    python benchmarks/weight_sync.py [--buckets-mb 256 1024 2048] [--reps 5] [--json out.json]
    python benchmarks/weight_sync.py --smoke      # tiny shapes, gloo on CPU: plumbing only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asyncrl.net import free_port  # noqa: E402
from asyncrl.sync.metadata import iter_bucket_plan, pack_bucket  # noqa: E402
from asyncrl.sync.nccl_engine import NCCLCheckpointEngine, NCCLSyncConfig, NCCLWeightReceiver, hf_load_fn  # noqa: E402,F401


def qwen_shapes(hidden=3584, layers=28, heads=28, kv_heads=4, inter=18944, vocab=152064, tied=False):
    """``[(hf_name, shape)]`` of a Qwen2 causal LM in HF order (defaults: Qwen2.5-7B)."""
    hd = hidden // heads
    kv = kv_heads * hd
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (hidden, hidden)), (p + "self_attn.q_proj.bias", (hidden,)),
                (p + "self_attn.k_proj.weight", (kv, hidden)), (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.weight", (kv, hidden)), (p + "self_attn.v_proj.bias", (kv,)),
                (p + "self_attn.o_proj.weight", (hidden, hidden)),
                (p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden)),
                (p + "mlp.down_proj.weight", (hidden, inter)),
                (p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,))]
    out.append(("model.norm.weight", (hidden,)))
    if not tied:
        out.append(("lm_head.weight", (vocab, hidden)))
    return out


SMOKE = dict(hidden=64, layers=2, heads=4, kv_heads=2, inter=96, vocab=1000)


def make_params(shapes, device):
    """Deterministic random bf16 tensors (same values on any device of the same type)."""
    out = {}
    for i, (name, shape) in enumerate(shapes):
        g = torch.Generator(device=device).manual_seed(i)
        out[name] = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    return out


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(fn, dev, reps):
    """Median seconds of ``fn`` over ``reps`` after one warm-up (host clock, device synchronised)."""
    fn()
    _sync(dev)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), ts


def _sender(args, port, q):
    smoke = args.smoke
    dev = torch.device("cpu" if smoke else "cuda:0")
    if not smoke:
        torch.cuda.set_device(dev)
    shapes = qwen_shapes(**(SMOKE if smoke else {}))
    params = make_params(shapes, dev)
    total = sum(t.numel() * t.element_size() for t in params.values())
    res = {"bytes": total, "tensors": len(params), "device": torch.cuda.get_device_name(0) if not smoke else "cpu"}
    if not smoke:  # P2P ceiling: one flat copy GPU0 -> GPU1
        src = torch.empty(total, dtype=torch.uint8, device=dev).random_()
        dst = torch.empty(total, dtype=torch.uint8, device="cuda:1")
        res["p2p_can_access"] = torch.cuda.can_device_access_peer(0, 1)

        def p2p():
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(1)
        res["p2p_s"], res["p2p_all_s"] = _timed(p2p, dev, args.reps)
        del src, dst
        torch.cuda.empty_cache()
    for bmb in args.buckets_mb:  # packing alone, one stream
        buf = torch.empty(int(bmb * 2**20), dtype=torch.uint8, device=dev)

        def pack():
            for metas, srcs in iter_bucket_plan(params.items(), buf.numel()):
                pack_bucket(buf, metas, srcs)
        res[f"pack_{bmb}_s"], _ = _timed(pack, dev, args.reps)
        del buf
    for j, bmb in enumerate(args.buckets_mb):
        eng = NCCLCheckpointEngine(NCCLSyncConfig(master_port=port + j, world_size=2, bucket_mb=bmb,
                                                  backend="gloo" if smoke else "nccl", device=str(dev),
                                                  metadata_channel=args.channel, timeout_s=300))
        res[f"group_{bmb}_s"] = eng.init_group()
        if j == 0:  # raw NCCL broadcast of one flat buffer, same group type
            flat = torch.empty(total, dtype=torch.uint8, device=dev).random_()

            def raw():
                eng.allreduce(0.0)
                eng.broadcast(flat).wait()
            res["nccl_flat_s"], res["nccl_flat_all_s"] = _timed(raw, dev, args.reps)
            del flat
            torch.cuda.empty_cache() if not smoke else None
        ts, inner = [], []
        for rep in range(args.reps + 1):
            eng.allreduce(0.0)
            t0 = time.perf_counter()
            m = eng.send_weights_sync(params.items(), version=rep)
            if rep:  # rep 0 is the warm-up
                ts.append(time.perf_counter() - t0)
                inner.append(m["sync/engine/transfer_s"])
        res[f"engine_{bmb}_s"], res[f"engine_{bmb}_all_s"] = statistics.median(ts), ts
        res[f"engine_{bmb}_buckets"] = m["sync/buckets"]
        eng.close()
    q.put(("sender", res))


def _receiver(args, port, q):
    smoke = args.smoke
    dev = torch.device("cpu" if smoke else "cuda:1")
    if not smoke:
        torch.cuda.set_device(dev)
    shapes = qwen_shapes(**(SMOKE if smoke else {}))
    dst = {n: torch.empty(s, dtype=torch.bfloat16, device=dev) for n, s in shapes}
    total = sum(t.numel() * t.element_size() for t in dst.values())

    @torch.no_grad()
    def load(ws):
        for n, t in ws:
            dst[n].copy_(t, non_blocking=True)
    out = {}
    for j, bmb in enumerate(args.buckets_mb):
        rx = NCCLWeightReceiver("127.0.0.1", port + j, 1, 2, device=str(dev), timeout_s=300)
        rx.init_group()
        if j == 0:
            flat = torch.empty(total, dtype=torch.uint8, device=dev)
            for _ in range(args.reps + 1):
                rx.allreduce(0.0)
                rx.broadcast(flat).wait()
                _sync(dev)
            del flat
        for t in dst.values():
            t.view(torch.int16).fill_(-1)  # poison: every byte must arrive
        for rep in range(args.reps + 1):
            rx.allreduce(0.0)
            rx.receive_weights(load)
        _sync(dev)
        want = make_params(shapes, dev)
        out[f"mismatch_{bmb}"] = [n for n in dst if not torch.equal(dst[n].view(torch.int16), want[n].view(torch.int16))]
        del want
        rx.close()
    q.put(("receiver", out))


def report(res, rx, args):
    gb = res["bytes"] / 1e9
    rows = []
    base = gb / res["p2p_s"] if "p2p_s" in res else None
    if base:
        rows.append(("p2p copy_ (flat, GPU0->GPU1)", res["p2p_s"], 1.0))
    if "nccl_flat_s" in res:
        rows.append(("NCCL broadcast (one flat buffer)", res["nccl_flat_s"], None))
    for bmb in args.buckets_mb:
        rows.append((f"engine, {bmb} MB buckets ({res[f'engine_{bmb}_buckets']:.0f} buckets)", res[f"engine_{bmb}_s"], None))
    for bmb in args.buckets_mb:
        rows.append((f"pack only, {bmb} MB buckets (GPU0 local)", res[f"pack_{bmb}_s"], None))
    print(f"\nweight sync: {res['tensors']} tensors, {gb:.2f} GB bf16, device {res['device']}, "
          f"median of {args.reps} reps")
    print(f"{'what':52s} {'ms':>9s} {'GB/s':>8s} {'vs p2p':>7s}")
    for name, s, _ in rows:
        r = f"{gb / s / (base or 1):7.1%}" if base else "   n/a"
        print(f"{name:52s} {s * 1e3:9.2f} {gb / s:8.1f} {r}")
    bad = {k: v for k, v in rx.items() if v}
    print("receiver bit-exact for every bucket size:", "yes" if not bad else f"NO {bad}")
    if base:
        best = max(args.buckets_mb, key=lambda b: -res[f"engine_{b}_s"])
        ratio = res[f"engine_{best}_s"] and res["p2p_s"] / res[f"engine_{best}_s"]
        print(f"target engine >= 85% of p2p: best {best} MB -> {ratio:.1%} -> {'MET' if ratio >= 0.85 else 'NOT MET'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buckets-mb", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--channel", default="zmq", choices=["zmq", "store"])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.smoke:
        args.buckets_mb = [1, 2]
    elif torch.cuda.device_count() < 2:
        sys.exit("needs 2 CUDA GPUs (or --smoke)")
    ctx = mp.get_context("spawn")
    q, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=f, args=(args, port, q)) for f in (_sender, _receiver)]
    for p in procs:
        p.start()
    out = dict(q.get(timeout=1200) for _ in procs)
    for p in procs:
        p.join(60)
    report(out["sender"], out["receiver"], args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
