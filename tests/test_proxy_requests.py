"""Trajectory proxy request surface (issue 13 items 2 and 3): one schema at the boundary, every
parameter honoured or refused with a 400 naming it, logprob bytes that are the token's own.

The engine is the scripted fake (tests/fake_engine.py); HTTP, the schema, the tokenizers and chat
templates are real. The real engines' side of ``stop`` / ``top_logprobs`` / penalties is tested in
tests/test_engine_params.py.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from fake_engine import FakeEngine, embedded_tokenizer, qwen_test_tokenizer

from asyncrl.agent_loop.proxy import TrajectoryProxy, normalize_message
from asyncrl.rollout.base import UnsupportedSamplingParam

CALC = [{"type": "function", "function": {"name": "calc", "parameters": {
    "type": "object", "properties": {"expr": {"type": "string"}}}}}]
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expr": "1+1"}}\n</tool_call>'
USER = [{"role": "user", "content": "What is 47+38?"}]


def _tok(name="embedded"):
    tok = embedded_tokenizer() if name == "embedded" else qwen_test_tokenizer(name)
    if tok is None:
        pytest.skip("embedded tokenizer not present")
    return tok


async def _serve(tok, script, requests, **kw):
    """Open one session, POST each body in order, return [(status, json)] and the trajectory."""
    engine = FakeEngine(tok, script)
    proxy = TrajectoryProxy(engine, tok, "hermes", **kw)
    out = []
    async with proxy, aiohttp.ClientSession() as http:
        token, url = await proxy.open_session()
        for body in requests:
            kw = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) \
                else {"json": body}
            async with http.post(f"{url}/chat/completions", **kw) as r:
                assert r.content_type == "application/json"
                out.append((r.status, await r.json()))
        traj = await proxy.pop_session(token)
    return out, traj, engine, proxy


def serve(tok, script, requests, **kw):
    return asyncio.run(_serve(tok, script, requests, **kw))


# ------------------------------------------------------------------------------ item 2: schema
ASSISTANT_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c0", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "1+1"}'}}]}
BAD = [
    # (body, param named in the error)
    ({"messages": USER + [{"role": "assistant", "content": "x", "tool_calls": [1]}, {"role": "user", "content": "?"}]},
     "messages[1].tool_calls[0]"),
    ({"messages": USER + [{"role": "assistant", "content": "x", "tool_calls": "calc"}, {"role": "user", "content": "?"}]},
     "messages[1].tool_calls"),
    ({"messages": USER, "tools": [{"type": "function", "function": "calc"}]}, "tools[0].function"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [{"function": {"name": "calc", "arguments": [1]}}]},
                          {"role": "tool", "content": "2"}]}, "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"model": "m"}, "messages"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "seed": 2 ** 70}, "seed"),
    ({"messages": USER, "n": 2}, "n"),
    ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
    ({"messages": USER, "tool_choice": {"type": "function", "function": {"name": "calc"}}}, "tool_choice"),
    ({"messages": USER, "parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": USER, "logit_bias": {"5": 10}}, "logit_bias"),
    ({"messages": USER, "top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ({"messages": USER, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"messages": USER, "stop": [""]}, "stop"),
    ({"messages": USER, "stop": ["a"] * 40}, "stop"),
    ({"messages": USER, "stop_token_ids": ["x"]}, "stop_token_ids[0]"),
    ({"messages": USER, "frequency_penalty": 9}, "frequency_penalty"),
    ({"messages": USER, "stream_options": {"include_usage": "x"}}, "stream_options.include_usage"),
    ({"messages": USER, "functions": [{"name": "calc"}]}, "functions"),
    ({"messages": USER, "unknown_field": 1}, "unknown_field"),
    ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages[0].content"),
]


@pytest.mark.parametrize("body, param", BAD, ids=[p for _, p in BAD])
def test_malformed_request_is_a_400_naming_the_field(body, param):
    (status, err), = serve(_tok(), ["ok"], [body])[0]
    assert status == 400, err
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["param"] == param and param.split("[")[0].split(".")[0] in err["error"]["message"]
    assert err["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [b"[" * 50000 + b"]" * 50000, b"\xff\xfe", b"", b"[]", b"null", b'"x"'])
def test_non_object_bodies_are_400_json(raw):
    (status, err), = serve(_tok(), ["ok"], [raw])[0]
    assert status == 400 and err["error"]["type"] == "invalid_request_error"


def test_tools_of_the_wrong_shape_once_the_model_calls_is_400_and_the_session_survives():
    """The issue's case: function "calc" (a string) after the model emitted a call used to be a 500."""
    tok = _tok("qwen2.5")
    first = {"messages": USER, "tools": CALC}
    results, traj, engine, proxy = serve(tok, [CALL, "It is 2."], [first])
    (status, body), = results
    assert status == 200 and body["choices"][0]["finish_reason"] == "tool_calls"
    msgs = USER + [body["choices"][0]["message"], {"role": "tool", "content": "2", "tool_call_id": "c0"}]
    results, traj, engine, proxy = serve(tok, [CALL, "It is 2."], [
        first, {"messages": msgs, "tools": [{"type": "function", "function": "calc"}]}, {"messages": msgs, "tools": CALC}])
    assert [s for s, _ in results] == [200, 400, 200]
    assert results[1][1]["error"]["param"] == "tools[0].function"
    final = [normalize_message(m, CALC) for m in msgs + [results[2][1]["choices"][0]["message"]]]
    assert traj.prompt_ids + traj.response_ids == proxy.renderer.render_ids(final, CALC)


def test_vendor_fields_on_messages_and_metadata_are_accepted():
    body = {"model": "m", "user": "u", "metadata": {"k": "v"}, "store": False, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": "hi", "name": "bob"}]}
    (status, _), = serve(_tok(), ["ok"], [body])[0]
    assert status == 200


# ------------------------------------------------------------------------------ item 3: parameters
def test_stop_string_cuts_content_and_ids():
    """The issue's case: stop=["\\n"] on "47+38=85\\n#### 85" answers "47+38=85"; the turn's ids end there
    too (the stop string starts at a token boundary), so the trajectory equals the one-shot render."""
    tok = _tok()
    results, traj, engine, proxy = serve(tok, ["47+38=85\n#### 85"], [
        {"messages": USER, "stop": ["\n"], "logprobs": True, "return_token_ids": True}])
    (status, body), = results
    choice = body["choices"][0]
    assert status == 200 and choice["message"]["content"] == "47+38=85" and choice["finish_reason"] == "stop"
    assert engine.calls[0][2].stop == ["\n"]  # the engine is asked to stop there too
    want = tok.encode("47+38=85", add_special_tokens=False)
    assert choice["token_ids"] == want and len(choice["logprobs"]["content"]) == len(want)
    # the model's ids (mask 1), then the EOS the engine did not produce (mask 0): a one-shot render
    assert [i for i, m in zip(traj.response_ids, traj.response_mask) if m] == want
    final = [normalize_message(m) for m in USER + [choice["message"]]]
    assert traj.prompt_ids + traj.response_ids == proxy.renderer.render_ids(final)


def test_stop_string_inside_a_token_keeps_that_token():
    tok = _tok("qwen2.5")
    text = "The answer is 42. Done. More"
    (status, body), = serve(tok, [text], [{"messages": USER, "stop": ["Done", "is 4"], "return_token_ids": True}])[0]
    choice = body["choices"][0]
    assert choice["message"]["content"] == "The answer "  # the earliest stop string wins
    kept = tok.decode(choice["token_ids"])
    assert kept.startswith("The answer ") and "is 4" in kept and "Done" not in kept


def test_stop_token_ids_reach_the_engine_and_end_the_turn():
    tok = _tok()
    hash_id = tok.encode("#", add_special_tokens=False)[0]
    results, traj, engine, proxy = serve(tok, ["85 # and more"], [
        {"messages": USER, "stop_token_ids": [hash_id], "return_token_ids": True}])
    (status, body), = results
    assert status == 200 and hash_id in engine.calls[0][2].stop_token_ids
    choice = body["choices"][0]
    assert choice["message"]["content"] == "85 " and choice["finish_reason"] == "stop"
    assert choice["token_ids"] == tok.encode("85 ", add_special_tokens=False)  # the stop id is not the turn's
    final = [normalize_message(m) for m in USER + [choice["message"]]]
    assert traj.prompt_ids + traj.response_ids == proxy.renderer.render_ids(final)


def test_logprob_bytes_are_the_tokens_own_utf8_bytes():
    """The issue's case: "é 😊" on the byte-level embedded tokenizer; 6 of its 8 tokens are partial characters."""
    tok = _tok()
    (status, body), = serve(tok, ["é 😊"], [{"messages": USER, "logprobs": True}])[0]
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 8 and sum(e["token"] == "\ufffd" for e in content) == 6
    assert [239, 191, 189] not in [e["bytes"] for e in content]
    assert bytes(b for e in content[:-1] for b in e["bytes"]).decode() == "é 😊"
    assert bytes(content[-1]["bytes"]).decode() == tok.eos_token  # an added token: its own text


def test_logprob_bytes_on_a_merged_byte_level_vocabulary():
    tok = _tok("qwen3")
    (status, body), = serve(tok, ["Déjà vu: 你好 <tool_call>"], [{"messages": USER, "logprobs": True}])[0]
    content = body["choices"][0]["logprobs"]["content"]
    assert bytes(b for e in content[:-1] for b in e["bytes"]).decode() == "Déjà vu: 你好 <tool_call>"


def test_top_logprobs_come_from_the_engine():
    tok = _tok()
    (status, body), = serve(tok, ["42"], [{"messages": USER, "logprobs": True, "top_logprobs": 3}])[0]
    content = body["choices"][0]["logprobs"]["content"]
    assert all(len(e["top_logprobs"]) == 3 for e in content)
    assert all(e["top_logprobs"][0]["token"] == e["token"] and e["top_logprobs"][0]["logprob"] == e["logprob"]
               for e in content)
    assert all(set(t) == {"token", "logprob", "bytes"} for e in content for t in e["top_logprobs"])


def test_sampling_parameters_follow_the_policy_and_are_never_silently_dropped():
    tok = _tok()
    body = {"messages": USER, "temperature": 0.3, "top_p": 0.5, "seed": 7, "presence_penalty": 0.5}
    results, traj, engine, _ = serve(tok, ["ok"], [body])  # RL default: overridden, and counted
    sp = engine.calls[0][2]
    assert (sp.temperature, sp.top_p, sp.seed, sp.presence_penalty) == (1.0, 1.0, None, 0.0)
    assert {k: v for k, v in traj.metrics.items() if "overridden" in k} == {
        f"agent/proxy/sampling_overridden/{k}": 1 for k in ("temperature", "top_p", "seed", "presence_penalty")}
    results, traj, engine, _ = serve(tok, ["ok"], [body], honor_request_sampling=True)
    sp = engine.calls[0][2]
    assert results[0][0] == 200 and (sp.temperature, sp.top_p, sp.seed, sp.presence_penalty) == (0.3, 0.5, 7, 0.5)


class _NoPenaltiesEngine(FakeEngine):
    async def generate(self, request_id, prompt_ids, sampling_params):
        if sampling_params.frequency_penalty:
            raise UnsupportedSamplingParam("frequency_penalty", "frequency_penalty is not supported by this engine")
        return await super().generate(request_id, prompt_ids, sampling_params)


def test_a_parameter_the_engine_cannot_honour_is_a_400_naming_it():
    tok = _tok()

    async def main():
        proxy = TrajectoryProxy(_NoPenaltiesEngine(tok, ["ok"]), tok, "hermes", honor_request_sampling=True)
        async with proxy, aiohttp.ClientSession() as http:
            _, url = await proxy.open_session()
            async with http.post(f"{url}/chat/completions", json={"messages": USER, "frequency_penalty": 0.5}) as r:
                return r.status, await r.json()

    status, err = asyncio.run(main())
    assert status == 400 and err["error"]["param"] == "frequency_penalty"


def test_tool_choice_none_returns_the_call_as_text():
    tok = _tok("qwen2.5")
    (status, body), = serve(tok, [CALL], [{"messages": USER, "tools": CALC, "tool_choice": "none"}])[0]
    msg = body["choices"][0]["message"]
    assert status == 200 and "tool_calls" not in msg and msg["content"] == CALL
    assert json.loads(msg["content"].split("\n")[1])["name"] == "calc"
