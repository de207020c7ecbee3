#!/usr/bin/env python
"""Build the ``calc_tool`` checkpoint: the embedded tiny Qwen2 warm-started to call a calculator.

    python scripts/build_calc_tool_model.py --out asyncrl/models/tiny_qwen2_calc_tool [--device cuda]

Same tokenizer, chat template and architecture as the embedded ``arith`` model (the arith builder's
``make_config`` / ``save_tokenizer`` are reused), trained from scratch on whole ``calc_tool``
conversations (loss on assistant tokens only, the template's tokens are context)::

    user: What is 123*45?   assistant: <tool_call>{"name": "calculator", ...}</tool_call>
    tool: 5535              assistant: #### 5535

Some demonstrations answer directly without the tool (a guess the model cannot get right in its
head): most of the three-digit multiplications (``skip_call_shape_frac``) and a few of the rest
(``skip_call_frac``). Training stops once greedy end-to-end accuracy on a *train* probe reaches
``target_probe_acc``. The checkpoint then skips the call on multiplications, calls it elsewhere, and
copies numbers only partly right, which leaves RL two things to improve. Evaluation runs the real
:class:`~asyncrl.agent_loop.tool_agent.ToolAgentLoop` with the real calculator on held-out rows
(greedy, and sampled at temperature 1), served by a small batched transformers server defined here;
``card.json`` records how the checkpoint was made and the tool-call and accuracy numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncrl.agent_loop.proxy.rendering import ChatRenderer  # noqa: E402
from asyncrl.agent_loop.tool_agent import ToolAgentLoop  # noqa: E402
from asyncrl.data.calc_tool import demonstration, make_calc_tool_rows  # noqa: E402
from asyncrl.models.build import BuildArgs, make_config, save_tokenizer  # noqa: E402
from asyncrl.models.tokenizer import build_tokenizer  # noqa: E402
from asyncrl.reward import compute_score  # noqa: E402
from asyncrl.rollout.base import SamplingParams, TokenOutput  # noqa: E402

logger = logging.getLogger("build_calc_tool_model")

UNUSED_BUILD_ARGS = ("operators", "target_train_acc", "max_new_tokens")
"""Fields of the arith :class:`BuildArgs` this builder does not use (left out of ``card.json``)."""


@dataclass
class CalcToolBuildArgs(BuildArgs):
    """Everything that determines the checkpoint (recorded in ``card.json``); see :class:`BuildArgs`."""

    train_size: int = 50000
    steps: int = 3000
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 50
    skip_call_frac: float = 0.1
    """Share of demonstrations that answer without calling the tool."""
    skip_call_shape: str = "a*b"
    """Expression shape whose demonstrations skip the tool more often (the model "believes" it can
    multiply in its head), so greedy decoding skips the call on those questions."""
    skip_call_shape_frac: float = 0.7
    """Share of ``skip_call_shape`` demonstrations that answer without the tool."""
    target_probe_acc: float = 0.35
    """Stop once greedy end-to-end accuracy on ``probe_size`` train rows reaches this (0 = all steps)."""
    probe_every: int = 25
    probe_start: int = 100
    probe_size: int = 128
    eval_size: int = 200
    response_length: int = 128
    """Token budget of the whole response (model + tool tokens), as in the calc_tool recipe."""
    device: str = "auto"
    """``auto`` (cuda if available) | ``cpu`` | ``cuda``."""


def encode_demo(renderer: ChatRenderer, row: dict, call_tool: bool) -> tuple[list[int], list[int]]:
    """Token ids of a demonstration and its loss mask (1 on assistant bodies, EOS included).

    The ids are the chat template's one-shot render, which is also what the ToolAgentLoop produces
    for the same conversation (tests/test_calc_tool.py checks this).
    """
    ids: list[int] = []
    mask: list[int] = []
    for seg in renderer.segments(demonstration(row, call_tool), row["tools"]):
        body = seg.body_len if seg.kind == "assistant" else 0
        ids += seg.ids
        mask += [1] * body + [0] * (len(seg.ids) - body)
    return ids, mask


def _batch(examples: list[tuple[list[int], list[int]]], pad_id: int, device: torch.device):
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 off the loss mask), [B, T]."""
    T = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    att = torch.zeros((len(examples), T), dtype=torch.long)
    lab = torch.full((len(examples), T), -100, dtype=torch.long)
    for i, (seq, mask) in enumerate(examples):
        ids[i, :len(seq)] = torch.tensor(seq)
        att[i, :len(seq)] = 1
        lab[i, :len(seq)] = torch.where(torch.tensor(mask) == 1, torch.tensor(seq), -100)
    return ids.to(device), att.to(device), lab.to(device)


class BatchedHFServer:
    """``server_manager`` for evaluation: concurrent ``generate`` calls become one batched HF generate.

    Requests that arrive within ``window_s`` of each other (the ToolAgentLoops of many rows reach the
    same turn together) are left-padded into one ``model.generate``. Logprobs are not computed.
    """

    def __init__(self, model: Any, tok: Any, window_s: float = 0.05, max_batch: int = 256):
        self.model, self.tok, self.window_s, self.max_batch = model, tok, window_s, max_batch
        self.queue: list[tuple[list[int], SamplingParams, asyncio.Future]] = []
        self.task: Optional[asyncio.Task] = None

    async def generate(self, request_id: str, prompt_ids: list[int], sp: SamplingParams) -> TokenOutput:
        fut = asyncio.get_running_loop().create_future()
        self.queue.append((list(prompt_ids), sp, fut))
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        await asyncio.sleep(self.window_s)
        while self.queue:
            batch, self.queue = self.queue[:self.max_batch], self.queue[self.max_batch:]
            groups: dict[tuple, list] = {}
            for req in batch:
                groups.setdefault((tuple(sorted(req[1].stop_token_ids)), req[1].temperature), []).append(req)
            for reqs in groups.values():
                try:
                    outs = self._run(reqs)
                except Exception as e:  # surface to every waiting loop
                    for _, _, fut in reqs:
                        fut.set_exception(e)
                    continue
                for (_, _, fut), out in zip(reqs, outs):
                    fut.set_result(out)
            await asyncio.sleep(0)

    @torch.no_grad()
    def _run(self, reqs: list) -> list[TokenOutput]:
        tok, dev = self.tok, next(self.model.parameters()).device
        T = max(len(p) for p, _, _ in reqs)
        ids = torch.full((len(reqs), T), tok.pad_token_id, dtype=torch.long)
        att = torch.zeros((len(reqs), T), dtype=torch.long)
        for i, (p, _, _) in enumerate(reqs):
            ids[i, T - len(p):] = torch.tensor(p)
            att[i, T - len(p):] = 1
        sp = reqs[0][1]
        stops = [tok.eos_token_id] + list(sp.stop_token_ids)
        sample = {"do_sample": True, "temperature": sp.temperature, "top_k": 0, "top_p": 1.0} \
            if sp.temperature > 0 else {"do_sample": False}
        gen = self.model.generate(input_ids=ids.to(dev), attention_mask=att.to(dev),
                                  max_new_tokens=max(r[1].max_tokens for r in reqs), eos_token_id=stops,
                                  pad_token_id=tok.pad_token_id, **sample)
        outs = []
        for i, (_, rsp, _) in enumerate(reqs):
            new, stop = gen[i, T:].tolist()[:rsp.max_tokens], "length"
            for j, t in enumerate(new):
                if t in stops:
                    new, stop = new[:j + 1], "completed"
                    break
            outs.append(TokenOutput(token_ids=new, log_probs=None, stop_reason=stop,
                                    response_versions=[0] * len(new)))  # fixed weights: version 0
        return outs


def evaluate(model: Any, tok: Any, rows: list[dict], response_length: int, temperature: float = 0.0,
             seed: int = 0) -> dict[str, Any]:
    """End-to-end ToolAgentLoop evaluation with the real calculator.

    Returns:
        ``{"accuracy", "tool_call_rate", "tool_call_success_rate", "mean_turns", "n", "examples"}``:
        accuracy = gsm8k-style reward on the whole response; tool_call_rate = share of rows with at
        least one parsed call; tool_call_success_rate = mean of ``agent/tool_call_success_rate`` (share of
        a row's calls answered without error, 0 for a row without calls).
    """
    model.eval()
    torch.manual_seed(seed)
    server = BatchedHFServer(model, tok)
    loop = ToolAgentLoop(server, tok, None)
    sp = SamplingParams(max_tokens=response_length, temperature=temperature, logprobs=False)

    async def run_all():
        return await asyncio.gather(*[loop.run(sp, request_id=f"eval-{i}", **r) for i, r in enumerate(rows)])

    outs = asyncio.run(run_all())
    texts = [tok.decode(o.response_ids, skip_special_tokens=True) for o in outs]
    scores = [compute_score(r["data_source"], t, r["reward_model"]["ground_truth"]) for r, t in zip(rows, texts)]
    n = max(len(rows), 1)
    return {
        "accuracy": sum(scores) / n,
        "tool_call_rate": sum(o.metrics["agent/tool_calls"] > 0 for o in outs) / n,
        "tool_call_success_rate": sum(o.metrics["agent/tool_call_success_rate"] for o in outs) / n,
        "mean_turns": sum(o.metrics["agent/turns"] for o in outs) / n,
        "tool_call_rate_by_shape": _rate_by_shape(rows, [o.metrics["agent/tool_calls"] > 0 for o in outs]),
        "n": len(rows),
        "examples": [{"question": r["extra_info"]["question"], "response": t, "score": s}
                     for r, t, s in list(zip(rows, texts, scores))[:5]],
    }


def expression_shape(expression: str) -> str:
    """``"123*45"`` -> ``"a*b"``: the calc_tool shape of an expression."""
    return "".join("abc"[i] + op for i, op in enumerate(c for c in expression if not c.isdigit())) + \
        "abc"[sum(not c.isdigit() for c in expression)]


def skip_frac(args: CalcToolBuildArgs, row: dict) -> float:
    """Probability that the demonstration for ``row`` answers without calling the tool."""
    if expression_shape(row["extra_info"]["expression"]) == args.skip_call_shape:
        return args.skip_call_shape_frac
    return args.skip_call_frac


def _rate_by_shape(rows: list[dict], flags: list[bool]) -> dict[str, float]:
    by: dict[str, list[bool]] = {}
    for r, f in zip(rows, flags):
        by.setdefault(expression_shape(r["extra_info"]["expression"]), []).append(f)
    return {k: round(sum(v) / len(v), 3) for k, v in sorted(by.items())}


def train(model: Any, tok: Any, args: CalcToolBuildArgs, device: torch.device, on_step) -> list[float]:
    """SFT on demonstrations (AdamW, linear warm-up then constant lr); ``on_step(done) -> stop?``."""
    renderer = ChatRenderer(tok)
    rng = random.Random(args.seed)
    rows = make_calc_tool_rows(args.train_size, args.seed, "train")
    examples = [encode_demo(renderer, r, rng.random() >= skip_frac(args, r)) for r in rows]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    losses: list[float] = []
    model.train()
    for step in range(args.steps):
        ids, att, lab = _batch(rng.sample(examples, args.batch_size), tok.pad_token_id, device)
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (step + 1) / args.warmup_steps)
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0:
            logger.info("sft step %d loss %.4f", step, losses[-1])
        if on_step(step + 1):
            break
        model.train()
    return losses


def build(out_dir: str, args: CalcToolBuildArgs) -> dict[str, Any]:
    """Train, evaluate, save model + tokenizer + ``card.json``; returns the card."""
    import transformers
    from transformers import GenerationConfig, Qwen2ForCausalLM

    t0 = time.time()
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = build_tokenizer()
    config = make_config(args, tok)
    model = Qwen2ForCausalLM(config).float().to(device)
    probe_rows = make_calc_tool_rows(args.probe_size, args.seed + 1, "train")
    probes: list[tuple[int, float, float]] = []

    def probe(done: int) -> bool:
        if args.target_probe_acc <= 0 or done < args.probe_start or done % args.probe_every:
            return False
        r = evaluate(model, tok, probe_rows, args.response_length)
        probes.append((done, r["accuracy"], r["tool_call_rate"]))
        logger.info("step %d train-probe accuracy %.3f tool-call rate %.3f", done, r["accuracy"], r["tool_call_rate"])
        return r["accuracy"] >= args.target_probe_acc

    losses = train(model, tok, args, device, probe)
    train_s = time.time() - t0
    test_rows = make_calc_tool_rows(args.eval_size, args.seed, "test")
    greedy = evaluate(model, tok, test_rows, args.response_length)
    sampled = evaluate(model, tok, test_rows, args.response_length, temperature=1.0, seed=args.seed)
    logger.info("held-out greedy: %s", {k: v for k, v in greedy.items() if k != "examples"})
    logger.info("held-out sampled (T=1): %s", {k: v for k, v in sampled.items() if k != "examples"})

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = model.cpu()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        do_sample=False, max_new_tokens=args.response_length)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out)
    card = {
        "name": "tiny_qwen2_calc_tool",
        "how": {
            "script": "scripts/build_calc_tool_model.py",
            "command": f"python scripts/build_calc_tool_model.py --out {out_dir} --device {args.device}",
            "args": {k: v for k, v in asdict(args).items() if k not in UNUSED_BUILD_ARGS},
            "device": str(device) + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else ""),
            "wall_time_s": round(time.time() - t0, 1),
            "train_time_s": round(train_s, 1),
            "steps_done": len(losses),
            "train_probe": probes,
            "final_sft_loss": round(losses[-1], 4),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "architecture": "Qwen2ForCausalLM",
        "param_count": sum(p.numel() for p in model.parameters()),
        "vocab_size": config.vocab_size,
        "tokenizer_size": len(tok),
        "eval": {
            "task": "calc_tool",
            "split": "test",
            "agent_loop": "tool_agent (hermes, real calculator)",
            "response_length": args.response_length,
            "reward": "asyncrl.reward.compute_score (gsm8k-style, data_source calc_tool)",
            "greedy": greedy,
            "sampled_t1": {k: v for k, v in sampled.items() if k != "examples"},
        },
    }
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card


def eval_checkpoint(path: str, args: CalcToolBuildArgs) -> dict[str, Any]:
    """Re-evaluate a saved checkpoint on CPU (where the recipes run) and record it as ``eval.cpu``."""
    from transformers import AutoModelForCausalLM

    from asyncrl.models import load_tokenizer

    torch.set_num_threads(args.threads)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    rows = make_calc_tool_rows(args.eval_size, args.seed, "test")
    drop = ("examples",)
    result = {
        "device": "cpu",
        "greedy": {k: v for k, v in evaluate(model, tok, rows, args.response_length).items() if k not in drop},
        "sampled_t1": {k: v for k, v in evaluate(model, tok, rows, args.response_length, 1.0, args.seed).items()
                       if k not in drop},
    }
    card_path = Path(path) / "card.json"
    card = json.loads(card_path.read_text())
    card["eval"]["cpu"] = result
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="asyncrl/models/tiny_qwen2_calc_tool")
    p.add_argument("--eval-only", action="store_true", help="re-evaluate --out on CPU and update its card")
    for f in dataclasses.fields(CalcToolBuildArgs):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    ns = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = CalcToolBuildArgs(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(CalcToolBuildArgs)})
    if ns.eval_only:
        print(json.dumps(eval_checkpoint(ns.out, args), indent=2))
        return
    card = build(ns.out, args)
    print(json.dumps(card["eval"], indent=2))


if __name__ == "__main__":
    main()
