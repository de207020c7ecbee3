#!/usr/bin/env python
"""Build the ``longtail`` checkpoint: the embedded arith model warm-started to count down.

    python scripts/build_longtail_model.py --out asyncrl/models/tiny_qwen2_longtail

Starts from the committed ``tiny_qwen2_arith`` checkpoint (same tokenizer and architecture) and
fine-tunes it on ``longtail`` rows (:mod:`asyncrl.data.longtail`; loss on the response only) until
greedy accuracy on a *train* probe reaches ``--target-probe-acc``. A short warm start leaves a
partly right model (borrows such as ``100 -> 99`` and long answers fail most), so RL has a reward
curve to climb; with lr 2e-3 on 2 CPU cores the probe passes 0.4 after ~100 updates and 0.9 after
~200. ``card.json`` records the arguments, the probe curve and the held-out greedy accuracy by
answer length.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncrl.data.longtail import make_longtail_rows  # noqa: E402
from asyncrl.models import EMBEDDED_MODEL_DIR, load_tokenizer  # noqa: E402
from asyncrl.models.build import _batch, encode_sft, evaluate_greedy, save_tokenizer  # noqa: E402

logger = logging.getLogger("build_longtail_model")


@dataclass
class LongtailBuildArgs:
    """Everything that determines the checkpoint (recorded in ``card.json``)."""

    seed: int = 0
    init: str = str(EMBEDDED_MODEL_DIR)
    """Starting checkpoint (the embedded arith model)."""
    train_size: int = 20000
    batch_size: int = 32
    lr: float = 2e-3
    warmup_steps: int = 20
    steps: int = 400
    """Maximum updates."""
    probe_start: int = 40
    probe_every: int = 10
    probe_size: int = 100
    target_probe_acc: float = 0.4
    eval_size: int = 200
    max_new_tokens: int = 384
    threads: int = 1


def build(out_dir: str, args: LongtailBuildArgs) -> dict:
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    t0 = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = load_tokenizer(args.init)
    model = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
    pairs = encode_sft(tok, make_longtail_rows(args.train_size, args.seed, "train"))
    probe_rows = make_longtail_rows(args.probe_size, args.seed + 1, "train")
    rng = random.Random(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    probes, losses = [], []
    model.train()
    for step in range(1, args.steps + 1):
        ids, att, lab = _batch(rng.sample(pairs, args.batch_size), tok.pad_token_id)
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, step / args.warmup_steps)
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step >= args.probe_start and step % args.probe_every == 0:
            acc, _ = evaluate_greedy(model, tok, probe_rows, args.max_new_tokens)
            model.train()
            probes.append((step, acc))
            logger.info("step %d loss %.4f train-probe greedy accuracy %.3f", step, losses[-1], acc)
            if acc >= args.target_probe_acc:
                break
    train_s = time.time() - t0
    test_rows = make_longtail_rows(args.eval_size, args.seed, "test")
    acc, texts = evaluate_greedy(model, tok, test_rows, args.max_new_tokens)
    by_len = {}
    for lo, hi in ((0, 16), (16, 64), (64, 400)):
        hits = [t.strip() == r["reward_model"]["ground_truth"] for r, t in zip(test_rows, texts)
                if lo <= r["extra_info"]["response_tokens"] < hi]
        by_len[f"{lo}-{hi} tokens"] = {"n": len(hits), "accuracy": round(sum(hits) / max(1, len(hits)), 3)}
    logger.info("held-out greedy accuracy %.3f on %d questions: %s", acc, len(test_rows), by_len)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        do_sample=False, max_new_tokens=args.max_new_tokens)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out)
    card = {
        "name": "tiny_qwen2_longtail",
        "how": {"script": "scripts/build_longtail_model.py",
                "command": f"python scripts/build_longtail_model.py --out {out_dir}",
                "args": {**asdict(args), "init": "asyncrl/models/tiny_qwen2_arith"},
                "wall_time_s": round(time.time() - t0, 1), "train_time_s": round(train_s, 1),
                "steps_done": len(losses), "train_probe": probes, "final_sft_loss": round(losses[-1], 4),
                "torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version()},
        "architecture": "Qwen2ForCausalLM",
        "param_count": sum(p.numel() for p in model.parameters()),
        "eval": {"task": "longtail", "split": "test", "eval_size": len(test_rows), "greedy_accuracy": acc,
                 "by_answer_length": by_len, "reward": "asyncrl.reward.countdown (exact sequence)",
                 "examples": [{"question": r["extra_info"]["question"], "response": t}
                              for r, t in zip(test_rows[:5], texts[:5])]},
    }
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="asyncrl/models/tiny_qwen2_longtail")
    for f in fields(LongtailBuildArgs):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    ns = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    card = build(ns.out, LongtailBuildArgs(**{f.name: getattr(ns, f.name) for f in fields(LongtailBuildArgs)}))
    print(json.dumps(card["eval"], indent=2))


if __name__ == "__main__":
    main()
