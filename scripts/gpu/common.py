"""Shared pieces of the GPU acceptance scripts (``scripts/gpu/*.py``): logging, results, model shapes, MFU.

Every script takes ``--out DIR`` and ``--device cuda|cpu``; ``cpu`` runs the same code at tiny sizes
(FSDP2 over gloo, the hf backend on CPU, the nccl engine's code over gloo), which is how the scripts
are checked on a machine without GPUs. Each writes ``DIR/<name>.json`` (its results and a ``checks``
dict of booleans, ``ok`` = all of them) and logs to stdout (``run_all.sh`` keeps it as ``<name>.log``).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)
for key, val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1"),
                 ("TOKENIZERS_PARALLELISM", "false"), ("RAY_DISABLE_USAGE_STATS", "1")):
    os.environ.setdefault(key, val)  # NVLink multicast stays off on the shared GPU hosts

H200_BF16_PEAK = 989.4e12
"""Dense bf16 FLOP/s of an H200 SXM (datasheet), the MFU denominator of benchmarks/RESULTS.md."""

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)
QWEN25_7B = dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                 intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=128, vocab_size=272, tie_word_embeddings=True)


def setup_logging() -> logging.Logger:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return logging.getLogger("gpu-script")


def env_info() -> dict[str, Any]:
    """Versions and devices (what the numbers were measured with)."""
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(),
                            "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    for mod in ("transformers", "ray", "omegaconf", "zmq"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as exc:  # reported, the script decides whether it matters
            info[mod] = f"missing: {exc}"
    return info


def run_main(name: str, out_dir: str, body: Callable[[dict], None]) -> int:
    """Run ``body(result)``; always write ``out_dir/name.json`` (also on a crash) and print a summary line."""
    log = setup_logging()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"name": name, "env": env_info(), "checks": {}, "started": time.time()}
    try:
        body(result)
    except BaseException as exc:  # the batch goes on; the JSON says what broke
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-4000:]
        log.exception("%s failed", name)
    result["wall_s"] = time.time() - result["started"]
    result["ok"] = "error" not in result and bool(result["checks"]) and all(result["checks"].values())
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"RESULT {name}: {'OK' if result['ok'] else 'FAILED'} checks={result['checks']} "
          f"error={result.get('error')}", flush=True)
    return 0 if result["ok"] else 1


def save_model(path: Path, shape: dict, dtype: str, seed: int = 0, max_positions: int = 8192,
               weights: bool = True) -> Path:
    """A random-init Qwen2 of ``shape`` with the embedded model's tokenizer (ids beyond its vocab decode
    to nothing, which the throughput runs do not mind); ``weights=False`` writes only the config
    (replicas with ``load_format=dummy``)."""
    import torch
    import transformers

    from asyncrl.models import EMBEDDED_MODEL_DIR

    path.mkdir(parents=True, exist_ok=True)
    for f in EMBEDDED_MODEL_DIR.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, path / f.name)
    cfg = transformers.Qwen2Config(**shape, max_position_embeddings=max_positions, rope_theta=1e6, eos_token_id=258,
                                   bos_token_id=256, pad_token_id=256, torch_dtype=dtype)
    cfg.save_pretrained(path)
    transformers.GenerationConfig(eos_token_id=258, bos_token_id=256, pad_token_id=256).save_pretrained(path)
    if weights:
        torch.manual_seed(seed)
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(dev):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
        model.save_pretrained(path)
        del model
    return path


def matmul_params(shape: dict) -> int:
    """Parameters in matmuls per token of a Qwen2 (attention projections, MLP, and the LM head)."""
    d, f, layers, v = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"], shape["vocab_size"]
    kv = shape["num_key_value_heads"] * d // shape["num_attention_heads"]
    per_layer = d * d * 2 + 2 * d * kv + 3 * d * f
    return layers * per_layer + d * v


def train_flops(shape: dict, seq_lens: list[int], resp_lens: list[int]) -> float:
    """Model FLOPs of one optimizer step (forward + backward), as in benchmarks/RESULTS.md: ``6 N_matmul``
    per token without the head, the head only where a response token is predicted, and causal
    attention ``6 L d s^2`` per sequence. Activation recompute is not counted."""
    d, layers, v = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    body = matmul_params(shape) - d * v
    return sum(6 * body * s + 6 * d * v * r + 6 * layers * d * s * s for s, r in zip(seq_lens, resp_lens))


def median(xs: list[float]) -> float:
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else float("nan")


def drive(exp: Any, deadline_s: float, log: logging.Logger | None = None) -> tuple[Any, dict, dict]:
    """Start ``exp`` and wait for it, but never past ``deadline_s`` seconds (a stuck pipeline must still
    report). Returns ``(summary or None, trainer status, rollouter snapshot)``; always stops ``exp``."""
    import ray

    log = log or logging.getLogger("gpu-script")
    t0 = time.time()
    summary = None
    try:
        exp.start()
        while True:
            ready, _ = ray.wait([exp._fit_ref], timeout=5.0)
            if ready:
                summary = exp.finish()
                break
            if time.time() - t0 > deadline_s:
                log.error("deadline %.0f s passed before the trainer finished; stopping", deadline_s)
                break
        trainer = ray.get(exp.trainer.status.remote(), timeout=60)
        rollouter = ray.get(exp.rollouter.snapshot.remote(), timeout=60)
    finally:
        exp.stop()
    return summary, trainer, rollouter
