"""Acceptance run (b, sync part): rollout-visible stall of one weight sync for a Qwen2.5-7B-shaped set.

    python scripts/gpu/sync7b.py --out OUTDIR [--syncs 5] [--bucket-mb 1024] [--device cuda|cpu]

The receiving side is the real rollout path: a RolloutReplica (Ray actor, one GPU) running the hf
backend with a 7B-shaped model (bf16, ``load_format=dummy``), generating while the sync happens. The
sending side is a Ray actor on the other GPU holding a 7B-shaped bf16 parameter set (the trainer's
rank 0 after the FSDP gather) with the ``nccl`` checkpoint engine (:class:`asyncrl.sync.nccl_replicas.
NCCLReplicaEngine`). Each sync is what the rollouter sees: ``pause("abort")`` -> send (broadcast +
load into the engine's own tensors) -> ``resume()``, timed from this driver. The first sync (group
formation) is reported apart. After the last sync every tensor is compared by SHA-256. Check: median
stall <= 60 ms (transfer alone measured 44 ms for 15.2 GB in benchmarks/RESULTS.md). Writes
``OUTDIR/sync7b.json``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import common


class ParamSender:
    """Ray actor: a Qwen2-shaped bf16 parameter set on this actor's device, sent with the nccl engine."""

    def __init__(self, model_dir: str, replica: object, bucket_bytes: int, backend: str, device: str,
                 dtype: str = "bfloat16"):
        import torch
        import transformers

        from asyncrl.sync.nccl_replicas import NCCLReplicaEngine

        cfg = transformers.AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            shapes = [(n, tuple(p.shape)) for n, p in transformers.AutoModelForCausalLM.from_config(cfg).named_parameters()]
        g = torch.Generator(device=device).manual_seed(7)
        self.tensors = {n: torch.randn(s, generator=g, device=device, dtype=torch.float32).to(getattr(torch, dtype))
                        for n, s in shapes}
        self.engine = NCCLReplicaEngine([replica], bucket_bytes=bucket_bytes, backend=backend)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    async def send(self, version: int) -> dict:
        for t in self.tensors.values():  # a new version: every tensor changes (in place, cheap)
            t.neg_()
        return await self.engine.send_weights(self.tensors.items(), version)

    def digests(self) -> dict:
        from asyncrl.sync.receiver import tensor_digest

        return {n: tensor_digest(t) for n, t in self.tensors.items()}


def main(args: argparse.Namespace, result: dict) -> None:
    import ray

    from asyncrl.rollout.base import SamplingParams
    from asyncrl.rollout.replica import RolloutReplica

    cuda = args.device == "cuda"
    model_dir = common.save_model(Path(tempfile.mkdtemp(prefix="asyncrl-7b-")), common.QWEN25_7B if cuda else common.TINY,
                                  "bfloat16", weights=False)
    ray.init(include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})  # REPO + carried wheels
    try:
        gpu = {"num_gpus": 1} if cuda else {}
        replica = RolloutReplica("hf", {"model_path": str(model_dir), "dtype": "bfloat16", "load_format": "dummy",
                                        "device": "cuda" if cuda else "cpu"}, actor_options={"num_cpus": 0, **gpu})
        replica.wait_ready(timeout=600)
        sender = ray.remote(ParamSender).options(num_cpus=0, **gpu).remote(
            str(model_dir), replica.actor, int(args.bucket_mb * 2**20), "nccl" if cuda else "gloo",
            "cuda" if cuda else "cpu")
        result["bytes"] = ray.get(sender.nbytes.remote())
        sp = SamplingParams(max_tokens=100_000, temperature=1.0, ignore_eos=True)
        rows, aborted = [], 0
        for v in range(1, args.syncs + 2):
            inflight = [replica.generate_async(f"g{v}-{i}", [1, 2, 3], sp) for i in range(4)]
            time.sleep(1.0)  # generation running when the sync starts
            t0 = time.perf_counter()
            ray.get(replica.pause_async("abort"))
            t1 = time.perf_counter()
            m = ray.get(sender.send.remote(v))
            t2 = time.perf_counter()
            ray.get(replica.resume_async())
            t3 = time.perf_counter()
            aborted += sum(o.stop_reason == "aborted" for o in ray.get(inflight))
            rows.append({"version": v, "stall_ms": 1e3 * (t3 - t0), "pause_ms": 1e3 * (t1 - t0),
                         "send_ms": 1e3 * (t2 - t1), "resume_ms": 1e3 * (t3 - t2),
                         "engine_transfer_ms": 1e3 * m.get("sync/engine/transfer_s", float("nan")),
                         "load_wait_ms": 1e3 * m.get("sync/load_wait_s", float("nan")),
                         "connect_ms": 1e3 * m.get("sync/connect_s", 0.0), "gbps": m.get("sync/gbps")})
        theirs, mine = ray.get(replica.actor.param_digests.remote()), ray.get(sender.digests.remote())
        bad = [n for n in mine if theirs.get(n) != mine[n]]
        timed = rows[1:]
        result.update(syncs=rows, first_sync=rows[0], stall_ms_median=common.median([r["stall_ms"] for r in timed]),
                      send_ms_median=common.median([r["send_ms"] for r in timed]),
                      engine_transfer_ms_median=common.median([r["engine_transfer_ms"] for r in timed]),
                      pause_ms_median=common.median([r["pause_ms"] for r in timed]),
                      resume_ms_median=common.median([r["resume_ms"] for r in timed]),
                      aborted_requests=aborted, tensors=len(mine), mismatched_tensors=bad[:10],
                      replica_version=replica.param_version())
        result["checks"] = {"bit_exact_last_sync": not bad and len(mine) > 0,
                            "replica_reports_last_version": result["replica_version"] == args.syncs + 1,
                            "generation_was_interrupted": aborted > 0}
        if cuda:
            result["checks"]["stall_le_60ms"] = result["stall_ms_median"] <= 60.0
    finally:
        ray.shutdown()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--syncs", type=int, default=5, help="timed syncs after the first (group formation)")
    p.add_argument("--bucket-mb", type=float, default=1024)
    a = p.parse_args()
    raise SystemExit(common.run_main("sync7b", a.out, lambda r: main(a, r)))
