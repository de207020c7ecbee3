"""Trajectory proxy: invariant 4 (token-in-token-out) and the OpenAI surface, over real HTTP.

Invariant 4: the proxy's accumulated ids equal a one-shot chat-template render of the final
conversation, token for token, and masks are 1 exactly on model-generated tokens. Checked for the
embedded tokenizer and for the real Qwen2.5 / Qwen3 templates (tests/data) on a Qwen-like test
tokenizer, across single turn, tool use, parallel calls, multi-turn chat and history edits.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os

import aiohttp
import pytest
from fake_engine import FakeEngine, embedded_tokenizer, qwen_test_tokenizer

from asyncrl.agent_loop.proxy import TrajectoryProxy, normalize_message
from asyncrl.rollout.base import SamplingParams

TOOLS = [{"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}]
SYS = {"role": "system", "content": "You are a careful math assistant."}


@functools.lru_cache(maxsize=None)
def tokenizer(name: str):
    if name == "embedded":
        tok = embedded_tokenizer()
        if tok is None:
            pytest.skip("embedded tokenizer (asyncrl.models.tokenizer) not present yet")
        return tok
    return qwen_test_tokenizer(name)


TOKENIZERS = ["embedded", "qwen2.5", "qwen3"]


def call(expr: str) -> str:
    return '<tool_call>\n{"name": "calc", "arguments": %s}\n</tool_call>' % json.dumps({"expr": expr})


def say(reason: str, text: str, think: bool) -> str:
    """An assistant text the way the template re-renders it (Qwen: one "\\n" before a call)."""
    if think:
        return f"<think>\n{reason}\n</think>\n\n{text}"
    return text


def tool(content: str, i: int = 0) -> dict:
    return {"role": "tool", "content": content, "tool_call_id": f"call_{i}"}


def scenarios(think: bool) -> dict:
    t = functools.partial(say, think=think)
    return {
        "single_turn": ([[SYS, {"role": "user", "content": "What is 6 times 7?"}]],
                        [t("Easy.", "The answer is 42.")], None),
        "tool_use": ([[SYS, {"role": "user", "content": "What is 6 times 7?"}], [tool("42")]],
                     [t("Use the tool.", ("Let me compute.\n" if not think else "") + call("6*7")),
                      t("Got it.", "The answer is 42.")], TOOLS),
        "parallel_calls": ([[{"role": "user", "content": "Compute 2+3 and 4*5."}], [tool("5", 0), tool("20", 1)]],
                           [t("Two calls.", call("2+3") + "\n" + call("4*5")), t("Both done.", "5 and 20.")], TOOLS),
        "three_tool_turns": ([[SYS, {"role": "user", "content": "Add 1, 2, 3 one by one."}], [tool("1")],
                              [tool("3")], [tool("6")]],
                             [t("a", call("0+1")), t("b", call("1+2")), t("c", call("3+3")), t("d", "It is 6.")],
                             TOOLS),
    }


async def drive(base_url: str, steps, tools, edits=None, http=None):
    """Play the agent: send messages, echo the assistant reply back, append the next step."""
    messages: list = []
    async with aiohttp.ClientSession() as http:
        for k, add in enumerate(steps):
            messages = messages + list(add)
            if edits and k in edits:
                messages = edits[k](messages)
            body = {"model": "policy", "messages": messages}
            if tools:
                body["tools"] = tools
            async with http.post(f"{base_url}/chat/completions", json=body) as r:
                data = await r.json()
                assert r.status == 200, data
            messages.append(data["choices"][0]["message"])
    return messages


def expected_mask(full: list[int], prompt_len: int, outputs: list[list[int]]) -> list[int]:
    """1 on each engine output located in order in the final ids (after the prompt), else 0."""
    mask, pos = [0] * len(full), prompt_len
    for out in outputs:
        at = next(i for i in range(pos, len(full) - len(out) + 1) if full[i:i + len(out)] == out)
        mask[at:at + len(out)] = [1] * len(out)
        pos = at + len(out)
    return mask[prompt_len:]


def check_invariant(proxy, traj, messages, tools, engine, edited=False):
    final = [normalize_message(m) for m in messages]
    reference = proxy.renderer.render_ids(final, tools)
    got = traj.prompt_ids + traj.response_ids
    assert got == reference, (proxy.tokenizer.decode(got), proxy.tokenizer.decode(reference))
    out_ids = [list(_gen(engine, i)) for i in range(len(engine.calls))]
    if not edited:
        assert traj.response_mask == expected_mask(got, len(traj.prompt_ids), out_ids)
        for (_, prompt, _), out in zip(engine.calls, out_ids):  # the model saw exactly the prefix
            assert got[:len(prompt)] == prompt and got[len(prompt):len(prompt) + len(out)] == out
    assert len(traj.response_ids) == len(traj.response_mask) == len(traj.response_logprobs)
    assert all(lp == 0.0 for m, lp in zip(traj.response_mask, traj.response_logprobs) if m == 0)
    traj.to_agent_loop_output().validate()


def _gen(engine, i):
    _, prompt, sp = engine.calls[i]
    text = engine.script[i % len(engine.script)]
    return engine.tokenizer.encode(text, add_special_tokens=False) + [engine.tokenizer.eos_token_id]


def run(coro):
    return asyncio.run(coro)


def make_proxy(tok, script, **kw):
    engine = FakeEngine(tok, script, **{k: kw.pop(k) for k in ("fail_on", "delay") if k in kw})
    return engine, TrajectoryProxy(engine, tok, "hermes", **kw)


@pytest.mark.parametrize("tok_name", TOKENIZERS)
@pytest.mark.parametrize("case", ["single_turn", "tool_use", "parallel_calls", "three_tool_turns"])
def test_invariant4_incremental(tok_name, case):
    tok = tokenizer(tok_name)
    steps, script, tools = scenarios(think=tok_name == "qwen3")[case]
    engine, proxy = make_proxy(tok, script)

    async def main():
        async with proxy:
            token, url = await proxy.open_session()
            messages = await drive(url, steps, tools)
            return messages, await proxy.pop_session(token)

    messages, traj = run(main())
    check_invariant(proxy, traj, messages, tools, engine)
    assert traj.metrics.get("agent/proxy/rebuilds", 0) == 0
    assert traj.metrics["agent/proxy/requests"] == len(script)
    n_calls = sum(s.count("<tool_call>") for s in script)
    assert traj.metrics.get("agent/tool_calls", 0) == n_calls
    assert traj.num_turns == sum(1 for m in messages if m["role"] != "system")


@pytest.mark.parametrize("tok_name", TOKENIZERS)
def test_must_hold_tool_roundtrip_includes_newline_after_im_end(tok_name):
    """user -> assistant(tool call) -> tool -> assistant: incremental ids == one-shot render."""
    tok = tokenizer(tok_name)
    steps, script, tools = scenarios(think=tok_name == "qwen3")["tool_use"]
    engine, proxy = make_proxy(tok, script)

    async def main():
        async with proxy:
            token, url = await proxy.open_session()
            return await drive(url, steps, tools), await proxy.pop_session(token)

    messages, traj = run(main())
    check_invariant(proxy, traj, messages, tools, engine)
    eos = tok.eos_token_id
    tail = proxy.renderer.eos_tail_ids
    assert tok.decode(tail) == "\n"
    model_eos = [j for j, (t, m) in enumerate(zip(traj.response_ids, traj.response_mask)) if t == eos and m]
    assert len(model_eos) == len(script)
    for j in model_eos:  # every model EOS is followed by the template's "\n" with mask 0
        assert traj.response_ids[j + 1:j + 1 + len(tail)] == tail
        assert traj.response_mask[j + 1:j + 1 + len(tail)] == [0] * len(tail)
    assert traj.response_ids[-len(tail):] == tail  # also after the final turn


@pytest.mark.parametrize("tok_name", ["embedded", "qwen2.5"])
def test_invariant4_multi_turn_chat(tok_name):
    # (Qwen3's template drops earlier turns' reasoning once a new user query arrives, so a one-shot
    # render of a multi-query chat is by design not what the model saw; the proxy records the latter.)
    tok = tokenizer(tok_name)
    steps = [[{"role": "user", "content": "Hi!"}], [{"role": "user", "content": "And 2+2?"}]]
    engine, proxy = make_proxy(tok, ["Hello, how can I help?", "2+2 is 4."])

    async def main():
        async with proxy:
            token, url = await proxy.open_session()
            return await drive(url, steps, None), await proxy.pop_session(token)

    messages, traj = run(main())
    check_invariant(proxy, traj, messages, None, engine)


@pytest.mark.parametrize("tok_name", TOKENIZERS)
def test_history_edit_rebuilds_segment_by_segment(tok_name, tmp_path):
    tok = tokenizer(tok_name)
    think = tok_name == "qwen3"
    steps, script, tools = scenarios(think)["three_tool_turns"]
    engine, proxy = make_proxy(tok, script, trajectory_dir=str(tmp_path))

    def edit_tool_output(msgs):  # the agent compacts an old observation (e.g. context management)
        msgs = [dict(m) for m in msgs]
        msgs[3] = {**msgs[3], "content": "1 (truncated)"}
        return msgs

    async def main():
        async with proxy:
            token, url = await proxy.open_session(request_id="edit-case")
            messages = await drive(url, steps, tools, edits={2: edit_tool_output})
            return messages, await proxy.pop_session(token)

    messages, traj = run(main())
    check_invariant(proxy, traj, messages, tools, engine, edited=True)
    assert traj.metrics["agent/proxy/rebuilds"] == 1
    # mask 1 exactly on model turns: all four assistant turns were generated by the model
    model_ids = [_gen(engine, i) for i in range(4)]
    assert sum(traj.response_mask) == sum(len(o) for o in model_ids)
    # turn 1 precedes the edited message: logprobs carried over the common token prefix; turn 2
    # follows it (generated under a context that no longer exists): mask 1, logprob 0.0 (seed
    # semantics); turns 3-4 were generated on the rebuilt context: fresh logprobs.
    sizes = [len(o) for o in model_ids]
    lps = [lp for m, lp in zip(traj.response_mask, traj.response_logprobs) if m]
    turn = [lps[sum(sizes[:i]):sum(sizes[:i + 1])] for i in range(4)]
    assert all(lp != 0.0 for lp in turn[0] + turn[2] + turn[3]) and set(turn[1]) == {0.0}
    assert traj.metrics["agent/proxy/rebuild_mask1_tokens_without_logprobs"] == sizes[1]
    files = sorted(os.listdir(tmp_path))
    assert {"edit-case.rebuild1.before.json", "edit-case.rebuild1.after.json", "edit-case.rebuild1.diff.json",
            "edit-case.trajectory.json"} <= set(files)
    diff = json.loads((tmp_path / "edit-case.rebuild1.diff.json").read_text())
    assert diff["first_changed_message"] == 3 and not diff["tools_changed"]


def test_edited_assistant_message_is_not_model_generated():
    tok = tokenizer("qwen2.5")
    engine, proxy = make_proxy(tok, ["First answer.", "Second answer."])

    async def main():
        async with proxy:
            token, url = await proxy.open_session()
            edit = {1: lambda ms: [ms[0], {"role": "assistant", "content": "An answer I wrote myself."}, ms[2]]}
            msgs = await drive(url, [[{"role": "user", "content": "Q1"}], [{"role": "user", "content": "Q2"}]],
                               None, edits=edit)
            return msgs, await proxy.pop_session(token)

    messages, traj = run(main())
    check_invariant(proxy, traj, messages, None, engine, edited=True)
    second = _gen(engine, 1)
    assert sum(traj.response_mask) == len(second)  # the hand-written turn is mask 0
    assert traj.metrics["agent/proxy/rebuilds"] == 1


# ------------------------------------------------------------------------------ OpenAI surface
def test_official_openai_client_chat_tools_streaming_and_token_ids():
    openai = pytest.importorskip("openai")
    tok = tokenizer("qwen2.5")
    steps, script, tools = scenarios(think=False)["tool_use"]
    engine, proxy = make_proxy(tok, script + script)

    async def main():
        async with proxy:
            token, url = await proxy.open_session(request_id="oa")
            client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
            assert [m.id for m in (await client.models.list()).data] == ["asyncrl-policy"]
            messages = list(steps[0])
            r = await client.chat.completions.create(
                model="asyncrl-policy", messages=messages, tools=tools, logprobs=True,
                extra_body={"return_token_ids": True})
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me compute."
            tc = choice.message.tool_calls[0]
            assert tc.function.name == "calc" and json.loads(tc.function.arguments) == {"expr": "6*7"}
            assert r.model_extra["prompt_token_ids"] == engine.calls[0][1]
            assert choice.model_extra["token_ids"] == _gen(engine, 0)
            assert [c.logprob for c in choice.logprobs.content] == pytest.approx(
                (await _engine_logprobs(engine, 0)))
            assert r.usage.completion_tokens == len(_gen(engine, 0))
            messages.append(choice.message)  # the pydantic message object, as agents do
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "42"})
            stream = await client.chat.completions.create(
                model="asyncrl-policy", messages=messages, tools=tools, stream=True,
                stream_options={"include_usage": True})
            text, finish, usage = "", None, None
            async for chunk in stream:
                if chunk.usage:
                    usage = chunk.usage
                for c in chunk.choices:
                    text += c.delta.content or ""
                    finish = c.finish_reason or finish
            assert text == "The answer is 42." and finish == "stop" and usage.completion_tokens > 0
            messages.append({"role": "assistant", "content": text})
            # streamed tool calls assemble into the same call
            token2, url2 = await proxy.open_session()
            client2 = openai.AsyncOpenAI(base_url=url2, api_key="unused", max_retries=0)
            calls = {}
            async for chunk in await client2.chat.completions.create(
                    model="m", messages=steps[0], tools=tools, stream=True):
                for c in chunk.choices:
                    for d in c.delta.tool_calls or []:
                        calls.setdefault(d.index, {"name": "", "arguments": ""})
                        calls[d.index]["name"] += d.function.name or ""
                        calls[d.index]["arguments"] += d.function.arguments or ""
            assert calls == {0: {"name": "calc", "arguments": '{"expr": "6*7"}'}}
            await proxy.pop_session(token2)
            with pytest.raises(openai.NotFoundError):
                await client2.chat.completions.create(model="m", messages=steps[0])
            return messages, await proxy.pop_session(token)

    messages, traj = run(main())
    assert traj.metrics.get("agent/proxy/rebuilds", 0) == 0
    final = [normalize_message(m if isinstance(m, dict) else m.model_dump()) for m in messages]
    assert traj.prompt_ids + traj.response_ids == proxy.renderer.render_ids(final, tools)


async def _engine_logprobs(engine, i):
    _, prompt, _ = engine.calls[i]
    n = len(_gen(engine, i))
    return [-0.01 * (1 + (k * 7 + len(prompt)) % 13) for k in range(n)]


async def _post(http, url, data=None, raw=None):
    kw = {"data": raw, "headers": {"Content-Type": "application/json"}} if raw is not None else {"json": data}
    async with http.post(f"{url}/chat/completions", **kw) as r:
        return r.status, await r.json()


def test_bad_input_is_a_4xx_openai_error_and_the_session_survives():
    tok = tokenizer("qwen2.5")
    steps, script, tools = scenarios(think=False)["tool_use"]
    engine, proxy = make_proxy(tok, script, max_model_len=400, max_request_bytes=4096, fail_on=[1])
    ok = {"model": "m", "messages": steps[0], "tools": tools}

    async def main():
        async with proxy, aiohttp.ClientSession() as http:
            token, url = await proxy.open_session(trajectory_dir=None)
            status, body = await _post(http, url, ok)
            assert status == 200
            messages = steps[0] + [body["choices"][0]["message"]]
            cases = [
                ("invalid json", None, b"{not json", 400),
                ("missing messages", {"model": "m"}, None, 400),
                ("empty messages", {"messages": []}, None, 400),
                ("unknown role", {"messages": messages + [{"role": "wizard", "content": "hi"}]}, None, 400),
                ("bad number", {"messages": messages + [tool("42")], "temperature": "hot"}, None, 400),
                ("ends with assistant", {"messages": messages}, None, 400),
                ("oversize", {"messages": messages + [tool("9" * 5000)]}, None, 413),
                ("context overflow", {"messages": messages + [tool("9 " * 300)], "tools": tools}, None, 400),
            ]
            for name, data, raw, code in cases:
                status, body = await _post(http, url, data, raw)
                assert status == code, (name, body)
                assert set(body["error"]) == {"message", "type", "param", "code"}, name
            assert body["error"]["code"] == "context_length_exceeded"
            # engine failure (2nd engine call) -> 502, nothing recorded
            status, body = await _post(http, url, {"messages": messages + [tool("42")], "tools": tools})
            assert status == 502 and body["error"]["code"] == "engine_error"
            status, body = await _post(http, url, {"messages": messages + [tool("42")], "tools": tools})
            assert status == 200
            messages += [tool("42"), body["choices"][0]["message"]]
            async with http.get(f"{url}/models") as r:
                assert r.status == 200
            async with http.get(url.replace(token, "not-a-session") + "/models") as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "session_not_found"
            return messages, await proxy.pop_session(token)

    messages, traj = run(main())
    assert traj.metrics["agent/proxy/requests"] == 2 and traj.metrics.get("agent/proxy/rebuilds", 0) == 0
    assert traj.metrics["agent/proxy/engine_errors"] == 1 and "fake engine failure" in traj.extra_fields["engine_error"]
    final = [normalize_message(m) for m in messages]
    assert traj.prompt_ids + traj.response_ids == proxy.renderer.render_ids(final, tools)


def test_max_consecutive_no_tool_ends_the_session():
    tok = tokenizer("embedded")
    engine, proxy = make_proxy(tok, ["hmm.", "still thinking."], max_consecutive_no_tool=2)

    async def main():
        async with proxy, aiohttp.ClientSession() as http:
            token, url = await proxy.open_session()
            msgs = [{"role": "user", "content": "go"}]
            for _ in range(2):
                status, body = await _post(http, url, {"messages": msgs})
                assert status == 200
                msgs += [body["choices"][0]["message"], {"role": "user", "content": "go on"}]
            status, body = await _post(http, url, {"messages": msgs})
            assert status == 409 and body["error"]["code"] == "session_ended"
            return await proxy.pop_session(token)

    traj = run(main())
    assert traj.extra_fields["ended"] == "max_consecutive_no_tool" and len(engine.calls) == 2


def test_length_cut_closes_turn_with_mask0_eos_and_caps_max_tokens():
    tok = tokenizer("embedded")
    engine, proxy = make_proxy(tok, ["a long answer that will be cut"],
                               sampling_params=SamplingParams(max_tokens=8))

    async def main():
        async with proxy, aiohttp.ClientSession() as http:
            token, url = await proxy.open_session(request_id="cut")
            msgs = [{"role": "user", "content": "talk"}]
            status, body = await _post(http, url, {"messages": msgs, "max_tokens": 1000})
            assert body["choices"][0]["finish_reason"] == "length"
            return msgs + [body["choices"][0]["message"]], await proxy.pop_session(token)

    messages, traj = run(main())
    assert engine.calls[0][2].max_tokens == 8 and engine.calls[0][0] == "cut"
    assert traj.response_mask == [1] * 8 + [0] * (1 + len(proxy.renderer.eos_tail_ids))
    assert traj.prompt_ids + traj.response_ids == proxy.renderer.render_ids([normalize_message(m) for m in messages])


def test_concurrent_sessions_are_isolated():
    tok = tokenizer("qwen2.5")
    steps, script, tools = scenarios(think=False)["tool_use"]
    engine, proxy = make_proxy(tok, lambda prompt: script[0] if "<tool_response>" not in tok.decode(prompt)
                               else script[1], delay=0.01)

    async def one():
        token, url = await proxy.open_session()
        msgs = await drive(url, steps, tools)
        return msgs, await proxy.pop_session(token)

    async def main():
        async with proxy:
            return await asyncio.gather(*(one() for _ in range(8)))

    for messages, traj in run(main()):
        final = [normalize_message(m) for m in messages]
        assert traj.prompt_ids + traj.response_ids == proxy.renderer.render_ids(final, tools)
        assert sum(traj.response_mask) == sum(len(tok.encode(s, add_special_tokens=False)) + 1 for s in script)
    assert len({rid for rid, _, _ in engine.calls}) == 8  # one sticky request id per session


def test_tools_changed_rebuilds_prompt_and_zeroes_logprobs_after_fork():
    tok = tokenizer("qwen2.5")
    steps, script, tools = scenarios(think=False)["tool_use"]
    engine, proxy = make_proxy(tok, script)
    more_tools = tools + [{"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]

    async def main():
        async with proxy, aiohttp.ClientSession() as http:
            token, url = await proxy.open_session()
            status, body = await _post(http, url, {"messages": steps[0], "tools": tools})
            msgs = steps[0] + [body["choices"][0]["message"], tool("42")]
            status, body = await _post(http, url, {"messages": msgs, "tools": more_tools})
            assert status == 200
            return msgs + [body["choices"][0]["message"]], await proxy.pop_session(token)

    messages, traj = run(main())
    final = [normalize_message(m) for m in messages]
    assert traj.prompt_ids + traj.response_ids == proxy.renderer.render_ids(final, more_tools)
    assert traj.metrics["agent/proxy/rebuilds"] == 1
    first, second = (len(_gen(engine, i)) for i in range(2))
    assert sum(traj.response_mask) == first + second  # both turns are still the model's
    lps = [lp for m, lp in zip(traj.response_mask, traj.response_logprobs) if m]
    assert set(lps[:first]) == {0.0} and 0.0 not in lps[first:]  # fork inside the prompt


def test_stop_releases_the_port():
    import socket

    tok = tokenizer("embedded")
    _, proxy = make_proxy(tok, ["x"])

    async def main():
        token, url = await proxy.open_session()  # starts lazily
        port = proxy.port
        assert url.startswith(f"http://127.0.0.1:{port}/s/{token}/v1")
        await proxy.stop()
        return port

    port = run(main())
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_rebuild_keeps_the_models_own_noncanonical_ids():
    """Token-in-token-out: after a rebuild, generated turns keep the ids the model sampled."""
    tok = tokenizer("qwen2.5")
    char_ids = lambda text: [i for c in text for i in tok.encode(c, add_special_tokens=False)]  # noqa: E731
    engine = FakeEngine(tok, ["The answer is 42.", "Yes, it is 42."], encode=char_ids)
    proxy = TrajectoryProxy(engine, tok, "hermes")

    async def main():
        async with proxy:
            token, url = await proxy.open_session()
            edit = {1: lambda ms: [{"role": "system", "content": "Be brief."}] + ms[1:]}  # edit the system prompt
            msgs = await drive(url, [[{"role": "system", "content": "Be kind."}, {"role": "user", "content": "6*7?"}],
                                     [{"role": "user", "content": "Sure?"}]], None, edits=edit)
            return msgs, await proxy.pop_session(token)

    messages, traj = run(main())
    assert traj.metrics["agent/proxy/rebuilds"] == 1
    model = [i for i, m in zip(traj.response_ids, traj.response_mask) if m]
    assert model == char_ids("The answer is 42.") + [tok.eos_token_id] + char_ids("Yes, it is 42.") + [tok.eos_token_id]
    assert model != tok.encode("The answer is 42.", add_special_tokens=False)  # really non-canonical
