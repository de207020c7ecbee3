"""Benchmark: trajectory-proxy tokenization, incremental delta vs full re-render, and requests/s.

Part 1 measures the per-turn tokenization work the proxy does for a multi-turn tool conversation
(assistant tool call -> tool result, repeated) at 8 / 32 / 128 turns:

- incremental: render + tokenize only the new observation (what the proxy does on the fast path);
- full: render + tokenize the whole conversation again (what a naive proxy would do each turn).

Part 2 measures end-to-end requests/s through HTTP (aiohttp server + aiohttp client, both in one
process on one event loop) with the scripted fake engine (zero generation time), so the number is
the proxy's own overhead: parse, render, tokenize, detokenize, parse tool calls, respond.

Both parts run in one process, side by side; ratios are printed. Usage::

    python benchmarks/proxy_tokenization.py [--template qwen2.5|qwen3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fake_engine import FakeEngine, qwen_test_tokenizer  # noqa: E402  (test fake, by design)

from asyncrl.agent_loop.proxy import ChatRenderer, TrajectoryProxy  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object",
                                                          "properties": {"expr": {"type": "string"}}}}}]


def call_text(i: int) -> str:
    return 'Step %d.\n<tool_call>\n{"name": "calc", "arguments": %s}\n</tool_call>' % (
        i, json.dumps({"expr": f"{i}+{i}"}))


def conversation(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "Add the numbers one by one and report the total."}]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": f"Step {i}.", "tool_calls": [
            {"type": "function", "function": {"name": "calc", "arguments": {"expr": f"{i}+{i}"}}}]})
        msgs.append({"role": "tool", "content": f"The result is {2 * i}. " * 4})
    return msgs


def bench_tokenization(renderer: ChatRenderer, turns: int, repeats: int) -> tuple[float, float]:
    """Mean seconds per turn (best of ``repeats``) for the incremental and the full path."""
    msgs = conversation(turns)
    inc_runs, full_runs = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for k in range(turns):  # each turn: the observation after assistant k (index 2 + 2k + 1)
            renderer.observation_ids(msgs[3 + 2 * k:4 + 2 * k])
        inc_runs.append((time.perf_counter() - t0) / turns)
        t0 = time.perf_counter()
        for k in range(turns):
            renderer.render_ids(msgs[:4 + 2 * k], TOOLS, add_generation_prompt=True)
        full_runs.append((time.perf_counter() - t0) / turns)
    return min(inc_runs), min(full_runs)


async def bench_requests(tok, sessions: int, turns: int) -> float:
    """Requests/s for ``sessions`` concurrent agents, each ``turns`` requests long."""
    import aiohttp

    engine = FakeEngine(tok, lambda prompt: call_text(len(prompt) % 97))
    proxy = TrajectoryProxy(engine, tok, "hermes")

    async def agent(http):
        token, url = await proxy.open_session()
        msgs = [{"role": "user", "content": "Add the numbers one by one."}]
        for i in range(turns):
            async with http.post(f"{url}/chat/completions", json={"model": "m", "messages": msgs,
                                                                  "tools": TOOLS}) as r:
                msg = (await r.json())["choices"][0]["message"]
            msgs += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": f"{i}"}]
        traj = await proxy.pop_session(token)
        assert traj.metrics.get("agent/proxy/rebuilds", 0) == 0

    async with proxy, aiohttp.ClientSession() as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(agent(http) for _ in range(sessions)))
        return sessions * turns / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--template", default="qwen2.5", choices=["qwen2.5", "qwen3"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tok = qwen_test_tokenizer(args.template)
    renderer = ChatRenderer(tok)
    print(f"# proxy tokenization benchmark ({args.template} template, byte-level BPE test tokenizer)")
    print(f"{'turns':>6} {'context_tokens':>15} {'incremental_ms/turn':>20} {'full_rerender_ms/turn':>22} {'ratio':>7}")
    for turns in (8, 32, 128):
        inc, full = bench_tokenization(renderer, turns, args.repeats)
        n_tokens = len(renderer.render_ids(conversation(turns), TOOLS))
        print(f"{turns:>6} {n_tokens:>15} {inc * 1e3:>20.3f} {full * 1e3:>22.3f} {full / inc:>6.1f}x")
    print()
    print(f"{'sessions':>8} {'turns':>6} {'requests/s':>11}   (HTTP + fake engine, zero generation time)")
    base = None
    for sessions, turns in ((1, 8), (16, 8), (16, 32)):
        rps = statistics.median(asyncio.run(bench_requests(tok, sessions, turns)) for _ in range(args.repeats))
        base = base or rps
        print(f"{sessions:>8} {turns:>6} {rps:>11.1f}   ({rps / base:.2f}x of 1 session)")


if __name__ == "__main__":
    main()
