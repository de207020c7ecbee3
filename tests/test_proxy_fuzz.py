"""Fuzz the trajectory proxy over real HTTP: 10,000 randomized and malformed requests.

::

    64 workers (asyncio, one aiohttp client) --- each holds one live session at a time --->  TrajectoryProxy
      pick a kind: valid turn | malformed body on its session | bad JSON | huge | unknown token | bad route
      record (kind, status); on 200 adopt the reply into the worker's conversation
      every few turns (or on context_length_exceeded): pop the session, check it, open a new one

Checks (issue 12 item 7): no response is a 5xx; no session reads another's data (every session's
prompt carries a secret key, the fake engine echoes the key it sees, and each reply and each popped
trajectory must hold its own key only); a session survives the malformed requests sent to it (its
final ids equal a one-shot render of its last accepted conversation, masks 1 exactly on the engine's
tokens); the server answers normally afterwards. The counts are printed (``pytest -s``) and repeated
in the terminal summary (``report_counts`` in conftest.py).

The engine is the scripted fake from ``tests/fake_engine.py``; the proxy, aiohttp and the chat
template are real.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import re

import aiohttp
import pytest
from fake_engine import FakeEngine, qwen_test_tokenizer

from asyncrl.agent_loop.proxy import TrajectoryProxy, normalize_message

TOTAL = 10_000
WORKERS = 64
MAX_BODY = 64 << 10
KEY = re.compile(r"KEY(\d{5})")
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Evaluate.", "parameters": {
    "type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}]


def echo_key(tokenizer):
    """Fake engine script: answer with the last session key found in the prompt."""
    def script(prompt_ids):
        keys = KEY.findall(tokenizer.decode(prompt_ids))
        return f"ack KEY{keys[-1]}" if keys else "ack none"
    return script


# ------------------------------------------------------------------------------ malformed bodies
def wrong_types(rng: random.Random, body: dict) -> dict:
    """A copy of a valid body with one field of a wrong type, shape or range."""
    b = json.loads(json.dumps(body))
    msg = b["messages"][-1]
    choice = rng.randrange(24)
    bad_values = [None, 0, -1, 1.5, True, "x", [], {}, [1, 2], {"a": 1}, 2**70, -2**70, 1e300, "NaN"]
    if choice == 0:
        b["messages"] = rng.choice([None, "hello", 5, {}, [], {"role": "user"}, [1, 2], [None], [[]], True])
    elif choice == 1:
        msg["role"] = rng.choice([None, 5, "robot", "", ["user"], {"r": 1}, "USER"])
    elif choice == 2:
        msg["content"] = rng.choice([5, 1.5, True, {"text": "x"}, [1], [None], [{"type": "image_url"}],
                                     [{"type": "text", "text": 5}], [{"type": "text"}], ["a"]])
    elif choice == 3:
        b["messages"].append({"role": "assistant", "content": "x",
                              "tool_calls": rng.choice([5, "calc", [5], ["x"], [None], [{"function": 5}],
                                                        [{"function": {"name": 5, "arguments": [1]}}],
                                                        [{"function": {"name": "calc", "arguments": "{bad"}}],
                                                        {"function": {}}, [[]]])})
    elif choice == 4:
        b["tools"] = rng.choice(["calc", 5, {"type": "function"}, [5], [None], [{"type": "function"}],
                                 [{"type": "function", "function": 5}], [[]], True])
    elif choice in (5, 6):
        b[rng.choice(["max_tokens", "max_completion_tokens"])] = rng.choice(bad_values + [0, 10**9, 2**31])
    elif choice == 7:
        b["temperature"] = rng.choice(bad_values + [-0.1, 2.5, 1e-300])
    elif choice == 8:
        b["top_p"] = rng.choice(bad_values + [-0.1, 1.01])
    elif choice == 9:
        b["seed"] = rng.choice(bad_values + [2**64, -2**64])
    elif choice == 10:
        b["n"] = rng.choice([0, 2, -1, "2", 1.5, None, [], 2**70])
    elif choice == 11:
        b["stream"] = rng.choice(["yes", 5, [], {}, None])
        b["stream_options"] = rng.choice(["x", 5, [], {"include_usage": "x"}, None])
    elif choice == 12:
        b["logprobs"] = rng.choice(["yes", 5, [], {}, None, 2**70])
        b["top_logprobs"] = rng.choice(["x", -1, 100, None])
    elif choice == 13:
        b["model"] = rng.choice([5, ["m"], {"m": 1}, None, "x" * 1000])
    elif choice == 14:
        b["return_token_ids"] = rng.choice(["x", 5, [], {}])
    elif choice == 15:
        msg.pop(rng.choice(["role", "content"]), None)
    elif choice == 16:
        b["messages"].insert(rng.randrange(len(b["messages"]) + 1), rng.choice(
            [{"role": "tool", "content": "5", "tool_call_id": 7}, {"role": "system", "content": None},
             {"role": "developer", "content": "be brief"}, {"role": "assistant"}, {"role": "tool"}]))
    elif choice == 17:
        b["tool_choice"] = rng.choice(["none", "required", {"type": "function"}, 5, ["x"]])
    elif choice == 18:
        b["stop"] = rng.choice(["x", ["a", "b"], 5, [5], None])
        b["frequency_penalty"] = rng.choice([0.5, "x", 1e9])
    elif choice == 19:
        b = rng.choice([[], [b], "body", 5, None, True])
    elif choice == 20:
        del b["messages"]
    elif choice == 21:
        msg["content"] = "\x00\ud800" if rng.random() < 0.5 else "\u202e\uffff\U0010ffff" * 10
    elif choice == 22:
        b["messages"] = [{"role": "assistant", "content": "I speak first"}]
    else:
        b[rng.choice(["unknown_field", "", "messages\x00"])] = rng.choice([1, "x", {"deep": [1, {"x": None}]}])
    return b


def bad_json(rng: random.Random, body: dict) -> bytes:
    text = json.dumps(body)
    return rng.choice([
        text[: rng.randrange(1, len(text))].encode(),
        b"", b"null", b"[]", b"123", b'"messages"', b"{", b"}", b"{'messages': []}", b"\xff\xfe\x00garbage",
        text.encode()[:-1] + b"\x80}", b"[" * 20000 + b"]" * 20000, b'{"messages": [' + b"{}," * 5000 + b"{}]}",
        b'{"messages": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}", text.replace('"role"', "role").encode(),
        (text + text).encode(), b"\x00" * 64, text.encode("utf-16"),
    ])


def huge(rng: random.Random, body: dict):
    """Over the body limit (413), over the context (400), or many messages."""
    b = json.loads(json.dumps(body))
    kind = rng.randrange(4)
    if kind == 0:
        b["messages"][-1]["content"] = "z" * (MAX_BODY + rng.randrange(1, 4096))
    elif kind == 1:
        b["messages"][-1]["content"] += " word" * rng.randrange(1000, 5000)
    elif kind == 2:
        b["messages"] = b["messages"] + [{"role": "user", "content": "hi"}] * rng.randrange(500, 2000)
    else:
        b["max_tokens"] = 10**12
    return b


def unknown_path(rng: random.Random, real_token: str) -> tuple[str, str]:
    token = rng.choice(["x", "0" * 32, real_token[:-1] + ("A" if real_token[-1] != "A" else "B"),
                        real_token + "x", "%2e%2e", "..", "%00", "\u00e9t\u00e9", "a" * 2000, "s p a c e"])
    return rng.choice(["POST", "GET"]), rng.choice([f"/s/{token}/v1/chat/completions", f"/s/{token}/v1/models"])


def bad_route(rng: random.Random, token: str) -> tuple[str, str]:
    return rng.choice([
        ("GET", f"/s/{token}/v1/chat/completions"), ("PUT", f"/s/{token}/v1/chat/completions"),
        ("DELETE", f"/s/{token}/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/"),
        ("POST", f"/s/{token}/v1/completions"), ("PATCH", "/s/"), ("GET", f"/s/{token}"),
        ("POST", f"/s/{token}/v1/chat/completions/extra"), ("OPTIONS", f"/s/{token}/v1/models"),
    ])


# ------------------------------------------------------------------------------ one worker
class Worker:
    def __init__(self, proxy, http, wid: int, rng: random.Random, stats: dict, with_tools: bool):
        self.proxy, self.http, self.wid, self.rng, self.stats = proxy, http, wid, rng, stats
        self.with_tools = with_tools
        self.token = self.url = None
        self.key = ""
        self.messages: list = []
        self.turns = 0

    async def open(self):
        self.stats["sessions"] += 1
        self.key = f"KEY{self.stats['sessions']:05d}"
        self.token, self.url = await self.proxy.open_session()
        self.messages = [{"role": "system", "content": f"Session {self.key}."}]
        self.turns = 0
        self.log: list = []

    async def close(self):
        """Pop the session; record (not raise) a cross-session read or a corrupted trajectory."""
        traj = await self.proxy.pop_session(self.token)
        self.stats["popped"] += 1
        tok = self.proxy.tokenizer
        ids = traj.prompt_ids + traj.response_ids
        if not set(KEY.findall(tok.decode(ids))) <= {self.key[3:]}:
            self.stats["cross_reads"].append((self.key, tok.decode(ids)))
        accepted = len(self.messages) > 1  # else the proxy served nothing: the trajectory is empty
        reference = (self.proxy.renderer.render_ids([normalize_message(m) for m in self.messages], self.tools())
                     if accepted else [])
        if ids != reference:
            self.stats["corrupted"].append((self.key, self.log[-1:], tok.decode(ids), tok.decode(reference)))
        assert len(traj.response_ids) == len(traj.response_mask) == len(traj.response_logprobs)
        assert all(lp == 0.0 for m, lp in zip(traj.response_mask, traj.response_logprobs) if m == 0)

    def tools(self):
        return TOOLS if self.with_tools else None

    def valid_body(self) -> dict:
        msgs = self.messages + [{"role": "user", "content": f"Turn {self.turns} of {self.key}: what is {self.turns}+1?"}]
        body = {"model": "policy", "messages": msgs, "max_tokens": self.rng.choice([None, 16, 64])}
        if self.with_tools:
            body["tools"] = TOOLS
        return {k: v for k, v in body.items() if v is not None}

    async def send(self, kind: str, method: str, path: str, **kw) -> tuple[int, bytes]:
        async with self.http.request(method, self.proxy.address + path, **kw) as r:
            data = await r.read()
        self.stats["status"][(kind, r.status)] += 1
        if r.status >= 500:  # collected and asserted at the end, so the counts cover the whole run
            self.stats["errors"].append((kind, r.status, kw.get("json", kw.get("data")), data[:300]))
        return r.status, data

    async def step(self):
        rng = self.rng
        roll = rng.random()
        chat = f"/s/{self.token}/v1/chat/completions"
        if roll < 0.22:  # a valid turn (sometimes streamed); adopted into the conversation
            body = self.valid_body()
            stream = rng.random() < 0.2
            if stream:
                body["stream"] = True
            status, data = await self.send("valid", "POST", chat, json=body)
            if status >= 500:
                return
            if status == 200:
                reply = _reply(data)
                if set(KEY.findall(reply["content"] or "")) != {self.key[3:]}:
                    self.stats["cross_reads"].append((self.key, reply))
                self.messages = body["messages"] + [reply]
                self.turns += 1
            else:
                assert json.loads(data)["error"]["code"] == "context_length_exceeded", data
            if self.turns >= 6 or status != 200:
                await self.close()
                await self.open()
        elif roll < 0.55:  # malformed fields on the worker's own live session
            body = wrong_types(rng, self.valid_body())
            status, data = await self.send("wrong_types", "POST", chat, json=body)
            if status == 200:  # accepted (e.g. an unknown field): the session moved on, follow it
                reply = _reply(data)
                self.log.append(body)
                self.messages = [normalize_message(m) for m in body["messages"]] + [reply]
                self.turns += 1
        elif roll < 0.67:
            await self.send("bad_json", "POST", chat, data=bad_json(rng, self.valid_body()),
                            headers={"Content-Type": "application/json"})
        elif roll < 0.74:
            body = huge(rng, self.valid_body())
            status, data = await self.send("huge", "POST", chat, json=body)
            if status == 200:
                reply = _reply(data)
                self.messages = body["messages"] + [reply]
                self.turns += 1
        elif roll < 0.86:
            method, path = unknown_path(rng, self.token)
            await self.send("unknown_session", method, path, json=self.valid_body())
        elif roll < 0.93:
            method, path = bad_route(rng, self.token)
            await self.send("bad_route", method, path, json=self.valid_body())
        else:
            status, data = await self.send("models", "GET", f"/s/{self.token}/v1/models")
            assert status == 200 and json.loads(data)["data"][0]["id"] == self.proxy.model_name


def _reply(data: bytes) -> dict:
    """The assistant message of a 200 answer, streamed (SSE) or not."""
    return _sse_message(data) if data.startswith(b"data: ") else json.loads(data)["choices"][0]["message"]


def _sse_message(data: bytes) -> dict:
    content, calls = "", []
    lines = [ln[len(b"data: "):] for ln in data.split(b"\n") if ln.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    for ln in lines[:-1]:
        for choice in json.loads(ln)["choices"]:
            content += choice["delta"].get("content") or ""
            calls += choice["delta"].get("tool_calls") or []
    return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}


async def fuzz(total: int = TOTAL, workers: int = WORKERS, seed: int = 0) -> dict:
    tok = qwen_test_tokenizer("qwen2.5")
    engine = FakeEngine(tok, echo_key(tok))
    proxy = TrajectoryProxy(engine, tok, "hermes", max_model_len=1024, max_request_bytes=MAX_BODY)
    stats = {"status": collections.Counter(), "sessions": 0, "popped": 0, "errors": [], "corrupted": [],
             "cross_reads": []}
    budget = iter(range(total))
    async with proxy:
        connector = aiohttp.TCPConnector(limit=workers)
        async with aiohttp.ClientSession(connector=connector) as http:
            async def run(wid: int):
                w = Worker(proxy, http, wid, random.Random(seed * 1000 + wid), stats, with_tools=wid % 4 == 0)
                await w.open()
                for _ in budget:
                    await w.step()
                await w.close()

            await asyncio.gather(*[run(i) for i in range(workers)])
            # healthy afterwards: a fresh session answers normally
            token, url = await proxy.open_session()
            async with http.post(f"{url}/chat/completions", json={"messages": [
                    {"role": "user", "content": "KEY99999 still there?"}]}) as r:
                assert r.status == 200 and "KEY99999" in (await r.json())["choices"][0]["message"]["content"]
            await proxy.pop_session(token)
        stats["open_sessions_left"] = len(proxy.sessions)
    return stats


@pytest.fixture(scope="module")
def fuzz_stats(report_counts):
    stats = asyncio.run(fuzz())
    report_counts(f"\nproxy fuzz: {sum(stats['status'].values())} requests, {stats['sessions']} sessions "
                  f"({stats['popped']} popped and checked), 5xx: {len(stats['errors'])}, cross-session reads: "
                  f"{len(stats['cross_reads'])}, sessions not equal to a one-shot render: {len(stats['corrupted'])}")
    report_counts("  by kind and status: " + ", ".join(f"{kind} {status}: {n}"
                                                       for (kind, status), n in sorted(stats["status"].items())))
    return stats


def test_fuzz_no_cross_session_reads_and_server_healthy(fuzz_stats):
    stats = fuzz_stats
    assert sum(stats["status"].values()) == TOTAL  # every request answered (the health check is extra)
    assert not stats["cross_reads"], stats["cross_reads"][:3]
    assert stats["open_sessions_left"] == 0
    assert stats["status"][("valid", 200)] > 500 and stats["sessions"] > WORKERS
    for kind in ("wrong_types", "bad_json", "huge", "unknown_session", "bad_route"):
        assert any(k == kind and 400 <= s < 500 for (k, s) in stats["status"]), kind


def test_fuzz_no_5xx(fuzz_stats):
    errors = fuzz_stats["errors"]
    assert not errors, f"{len(errors)} 5xx answers; first 5:\n" + "\n".join(repr(e)[:400] for e in errors[:5])


def test_fuzz_sessions_equal_one_shot_render(fuzz_stats):
    bad = fuzz_stats["corrupted"]
    assert not bad, f"{len(bad)} sessions; first (key, last accepted body, got, one-shot render): {bad[0]!r}"[:3000]
