#!/usr/bin/env python
"""Build the ``bash_tool`` checkpoint: the calc_tool tiny Qwen2 taught to fix the example tasks with bash.

    python scripts/build_bash_tool_model.py --out asyncrl/models/tiny_qwen2_bash_tool   # ~5 min on 2 CPU cores

A stand-in for a coding model that notebook 04 and ``swe_grpo_cpu`` can run on a CPU: it calls the
``bash`` tool through the trajectory proxy, the sandbox runs the command, and the verifier rewards it.
Warm-started from ``tiny_qwen2_calc_tool`` (which already speaks the chat template and hermes tool
calls) with 1024 positions (RoPE, no learned positions: the base's weights carry over), then
fine-tuned on one demonstration per task in ``examples/tasks/``, exactly as the compact bash agent
and the proxy render it (loss on assistant tokens only)::

    user: <instruction.md>            assistant: <tool_call>{"name": "bash", "arguments": {"command": <the
    tool: [exit code 0]\n<output>                last line of solution/solve.sh> && <a check>}}</tool_call>
                                      assistant: Done.

The check prints something that shows the fix (``CHECKS``), so the shell output the model sees, mask 0 in
its trajectory, is more than an exit code; it is recorded by running the command in the task's sandbox.

It knows these four fixes by heart and nothing else: the point is a real trajectory (tool calls mask 1,
shell output mask 0, a verifier's reward), not a capable agent. Training stops once greedy decoding
reproduces every demonstration and the loss is low enough that sampled commands are often right too.
Building needs bubblewrap (the demonstrated shell output is real). ``card.json`` then records end-to-end
trials through the real
:class:`~asyncrl.agent_loop.sandbox.SandboxAgentLoop` (bubblewrap sandbox, proxy, verifier), greedy and
sampled at temperature 1.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import platform
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncrl.agent_loop.proxy.rendering import ChatRenderer  # noqa: E402
from asyncrl.agent_loop.sandbox import EXAMPLES_DIR, example_rows, list_tasks  # noqa: E402
from asyncrl.agent_loop.sandbox.bash_agent import COMPACT_BASH_TOOL  # noqa: E402
from asyncrl.models import EMBEDDED_MODEL_DIR, load_tokenizer  # noqa: E402
from asyncrl.models.build import save_tokenizer  # noqa: E402

logger = logging.getLogger("build_bash_tool_model")

BASE = EMBEDDED_MODEL_DIR.parent / "tiny_qwen2_calc_tool"
FINAL_ANSWER = "Done."
CHECKS = {
    "fix-csv-total": "python3 /app/total.py /app/sales.csv",
    "fix-off-by-one": "cd /app && python3 -c 'import mathutils as m; print(m.sum_range(1, 4))'",
    "fix-word-count": "cd /app && python3 -c 'import wordcount as w; print(w.count_words(\"a  b\"))'",
    "hello-file": "cat /app/hello.txt",
}
"""Per example task: a command run after the fix whose output shows it worked."""


@dataclass
class BashToolBuildArgs:
    """Everything that determines the checkpoint (recorded in ``card.json``)."""

    seed: int = 0
    base: str = str(BASE)
    max_position_embeddings: int = 1024
    steps: int = 600
    lr: float = 1e-3
    warmup_steps: int = 20
    check_every: int = 25
    target_loss: float = 0.004
    """Keep training past reproduction until the SFT loss (nats per assistant token) is this low: a ~190-token
    command sampled at temperature 1 comes out right with probability about exp(-loss * 190)."""
    threads: int = 2
    trials_per_task: int = 4
    """Sampled (temperature 1) end-to-end trials per task for the card (0: no trials, not even greedy)."""
    max_tokens_per_turn: int = 256


def solution_command(task: Any) -> str:
    """The last non-comment line of the task's ``solution/solve.sh`` (one shell command)."""
    lines = [x for x in (task.path / "solution" / "solve.sh").read_text().splitlines() if x.strip() and not x.startswith("#")]
    return lines[-1].strip()


def command(task: Any) -> str:
    """The demonstrated command: the fix, then its check."""
    return f"{solution_command(task)} && {CHECKS[task.name]}"


async def tool_output(task: Any, cmd: str) -> str:
    """What the bash agent would send back after running ``cmd`` in a fresh sandbox of ``task``."""
    import tempfile

    from asyncrl.agent_loop.sandbox import start_sandbox
    from asyncrl.agent_loop.sandbox.bash_agent import BashAgent

    sandbox = await start_sandbox(task.path / "environment", tempfile.mkdtemp(prefix="asyncrl-build-"))
    try:
        res = await sandbox.exec(cmd, timeout_sec=60)
    finally:
        await sandbox.stop()
    if res.return_code != 0:
        raise RuntimeError(f"{task.name}: the demonstrated command failed: {res.stdout}{res.stderr}")
    return BashAgent()._format(res.return_code, res.stdout, res.stderr, res.timed_out)


def demonstration(task: Any, output: str) -> list[dict]:
    """The conversation the compact bash agent would have with a model that knows the fix."""
    call = {"type": "function", "function": {"name": "bash", "arguments": {"command": command(task)}}}
    return [{"role": "user", "content": task.instruction},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": output},
            {"role": "assistant", "content": FINAL_ANSWER}]


def encode(renderer: ChatRenderer, messages: list[dict]) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Ids, loss mask (1 on assistant bodies incl. EOS) and the ``(start, end)`` of each assistant body."""
    ids: list[int] = []
    mask: list[int] = []
    bodies = []
    for seg in renderer.segments(messages, [COMPACT_BASH_TOOL]):
        body = seg.body_len if seg.kind == "assistant" else 0
        if body:
            bodies.append((len(ids), len(ids) + body))
        ids += seg.ids
        mask += [1] * body + [0] * (len(seg.ids) - body)
    return ids, mask, bodies


@torch.no_grad()
def reproduces(model: Any, ids: list[int], bodies: list[tuple[int, int]]) -> bool:
    """Greedy decoding from each assistant turn's context gives that turn's body exactly."""
    model.eval()
    for start, end in bodies:
        out = model.generate(input_ids=torch.tensor([ids[:start]]), max_new_tokens=end - start + 2, do_sample=False,
                             eos_token_id=ids[end - 1], pad_token_id=0)
        if out[0, start:].tolist() != ids[start:end]:
            return False
    return True


def train(model: Any, examples: list[tuple[list[int], list[int], list]], args: BashToolBuildArgs) -> tuple[list[float], int]:
    """Full-batch SFT (AdamW, warm-up then constant lr) until every demonstration is reproduced and the loss
    is at most ``target_loss``."""
    T = max(len(ids) for ids, _, _ in examples)
    inp = torch.zeros((len(examples), T), dtype=torch.long)
    att = torch.zeros_like(inp)
    lab = torch.full_like(inp, -100)
    for i, (ids, mask, _) in enumerate(examples):
        inp[i, :len(ids)] = torch.tensor(ids)
        att[i, :len(ids)] = 1
        lab[i, :len(ids)] = torch.where(torch.tensor(mask) == 1, torch.tensor(ids), -100)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    losses: list[float] = []
    for step in range(args.steps):
        model.train()
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (step + 1) / args.warmup_steps)
        loss = model(input_ids=inp, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % args.check_every == 0:
            done = sum(reproduces(model, ids, bodies) for ids, _, bodies in examples)
            logger.info("step %d loss %.4f: %d/%d demonstrations reproduced", step + 1, losses[-1], done, len(examples))
            if done == len(examples) and losses[-1] <= args.target_loss:
                return losses, step + 1
    return losses, args.steps


async def trials(model_dir: str, args: BashToolBuildArgs, temperature: float, n: int) -> list[dict]:
    """End-to-end trials through the real sandboxed loop: HF engine -> proxy -> bash agent -> bwrap -> verifier."""
    from asyncrl.agent_loop.proxy import TrajectoryProxy
    from asyncrl.agent_loop.sandbox import SandboxAgentLoop, SandboxLoopConfig
    from asyncrl.rollout.base import SamplingParams
    from asyncrl.rollout.hf_backend import HFEngine

    tok = load_tokenizer(model_dir)
    engine = HFEngine(model_dir, seed=args.seed, torch_threads=args.threads)
    await engine.start()
    proxy = TrajectoryProxy(engine, tok, "hermes", max_model_len=args.max_position_embeddings)
    scfg = SandboxLoopConfig(agent="bash", compact_prompt=True, max_turns=2, max_tokens_per_turn=args.max_tokens_per_turn,
                             max_retries=0)
    loop = SandboxAgentLoop(engine, tok, None, proxy=proxy, sandbox_config=scfg)
    sp = SamplingParams(max_tokens=args.max_tokens_per_turn, temperature=temperature, seed=args.seed)
    rows = example_rows()
    try:
        outs = await asyncio.gather(*[loop.run(sp, request_id=f"card-{temperature}-{k}-{i}", **row)
                                      for k in range(n) for i, row in enumerate(rows)])
    finally:
        await proxy.stop()
        await engine.shutdown()
    return [{"task": row["extra_info"]["task_name"], "reward": o.reward_score, "model_calls": o.metrics.get(
             "agent/proxy/requests"), "model_tokens": sum(o.response_mask), "response_tokens": len(o.response_ids),
             "exit": o.extra_fields["sandbox"]["exit_reason"]} for row, o in zip(rows * n, outs)]


def build(out_dir: str, args: BashToolBuildArgs) -> dict[str, Any]:
    """Warm start, fine-tune, save model + tokenizer, run the end-to-end trials, write ``card.json``."""
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    t0 = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    tok = load_tokenizer(args.base)
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    model.config.max_position_embeddings = args.max_position_embeddings
    renderer = ChatRenderer(tok)
    tasks = list_tasks(EXAMPLES_DIR)
    outputs = {t.name: asyncio.run(tool_output(t, command(t))) for t in tasks}
    logger.info("demonstrated tool outputs: %s", outputs)
    examples = [encode(renderer, demonstration(t, outputs[t.name])) for t in tasks]
    lengths = {t.name: len(ids) for t, (ids, _, _) in zip(tasks, examples)}
    if max(lengths.values()) > args.max_position_embeddings:
        raise ValueError(f"demonstrations longer than {args.max_position_embeddings} positions: {lengths}")
    losses, steps = train(model, examples, args)
    train_s = time.time() - t0
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id, do_sample=False,
                                               max_new_tokens=args.max_tokens_per_turn)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out)
    tok_cfg = out / "tokenizer_config.json"  # the tokenizer's own length limit follows the model's
    tok_cfg.write_text(json.dumps(json.loads(tok_cfg.read_text()) | {"model_max_length": args.max_position_embeddings},
                                  indent=2, ensure_ascii=False) + "\n")
    card: dict[str, Any] = {
        "name": "tiny_qwen2_bash_tool",
        "how": {
            "script": "scripts/build_bash_tool_model.py",
            "command": f"python scripts/build_bash_tool_model.py --out {out_dir}",
            "args": asdict(args) | {"base": str(Path(args.base).name)},
            "device": "cpu", "train_time_s": round(train_s, 1), "steps_done": steps,
            "final_sft_loss": round(losses[-1], 5),
            "demonstration_tokens": lengths,
            "demonstrations": {t.name: {"command": command(t), "tool_output": outputs[t.name]} for t in tasks},
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "note": "Knows the fixes of the example tasks by heart (one demonstration each) and nothing else: a "
                    "stand-in for a coding model so that notebook 04 shows real tool calls on a CPU.",
        },
        "architecture": "Qwen2ForCausalLM",
        "param_count": sum(p.numel() for p in model.parameters()),
    }
    if args.trials_per_task and shutil.which("bwrap"):
        greedy = asyncio.run(trials(str(out), args, 0.0, 1))
        sampled = asyncio.run(trials(str(out), args, 1.0, args.trials_per_task))
        card["eval"] = {
            "trials": "SandboxAgentLoop, bash agent (compact prompt, max_turns 2), bubblewrap sandbox, task verifier",
            "greedy": greedy,
            "sampled_t1": {"mean_reward": sum(r["reward"] or 0 for r in sampled) / len(sampled), "n": len(sampled),
                           "by_task": {t: sum(r["reward"] or 0 for r in sampled if r["task"] == t) / args.trials_per_task
                                       for t in sorted({r["task"] for r in sampled})}},
        }
    else:
        card["eval"] = "not run: --trials-per-task 0, or bubblewrap (bwrap) is not installed"
    card["how"]["wall_time_s"] = round(time.time() - t0, 1)
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="asyncrl/models/tiny_qwen2_bash_tool")
    for f in dataclasses.fields(BashToolBuildArgs):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    ns = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = BashToolBuildArgs(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(BashToolBuildArgs)})
    card = build(ns.out, args)
    print(json.dumps(card.get("eval"), indent=2))


if __name__ == "__main__":
    main()
