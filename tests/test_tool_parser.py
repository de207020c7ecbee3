"""Tool parsers: executed calls, content kept for re-rendering, and every reported error kind."""

import json

import pytest

from asyncrl.agent_loop.tool_parser import ERROR_KINDS, get_tool_parser

CALC = {"type": "function", "function": {"name": "calc", "parameters": {
    "type": "object", "properties": {"expr": {"type": "string"}, "digits": {"type": "integer"}}}}}


def hermes_call(name, args):
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, json.dumps(args))


def test_registry_and_end_token():
    for name in ("hermes", "qwen3_coder"):
        p = get_tool_parser(name)
        assert p.name == name and p.end_token == "</tool_call>"
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("nope")


def test_hermes_single_and_parallel_calls_content_stripped():
    p = get_tool_parser("hermes")
    text = "Let me compute.\n" + hermes_call("calc", {"expr": "1+2"}) + "\n" + hermes_call("calc", {"expr": "3"})
    r = p.parse(text, [CALC])
    assert [(c.name, c.arguments) for c in r.calls] == [("calc", {"expr": "1+2"}), ("calc", {"expr": "3"})]
    assert r.content == "Let me compute." and r.errors == []
    oa = r.calls[0].to_openai()
    assert oa["type"] == "function" and json.loads(oa["function"]["arguments"]) == {"expr": "1+2"}
    assert r.metrics() == {"agent/tool_calls": 2}


def test_call_inside_think_is_not_executed_but_the_one_after_is():
    p = get_tool_parser("hermes")
    text = ("<think>\nmaybe " + hermes_call("calc", {"expr": "0"}) + "\n</think>\n\n"
            + hermes_call("calc", {"expr": "1+1"}))
    r = p.parse(text, [CALC])
    assert len(r.calls) == 1 and r.calls[0].arguments == {"expr": "1+1"}
    assert [e.kind for e in r.errors] == ["inside_think"]
    assert r.metrics()["agent/tool_parse_errors/inside_think"] == 1
    assert "maybe <tool_call>" in r.content  # the reasoning text is kept verbatim


def test_leading_close_think_without_open_counts_as_reasoning():
    p = get_tool_parser("hermes")
    text = "hmm " + hermes_call("calc", {"expr": "0"}) + "\n</think>\n\nok"
    r = p.parse(text)
    assert r.calls == [] and [e.kind for e in r.errors] == ["inside_think"]


@pytest.mark.parametrize("body, kind", [
    ('<tool_call>\n{"name": "calc", "arguments": {"expr": }\n</tool_call>', "malformed"),
    ('<tool_call>\n["calc"]\n</tool_call>', "malformed"),
    ('<tool_call>\n{"name": "calc", "arguments": 3}\n</tool_call>', "malformed"),
    (hermes_call("rm_rf", {}), "unknown_function"),
    ('<tool_call>\n{"name": "calc", "argu', "truncated"),
    ("<think>" + hermes_call("calc", {"expr": "1"}), "inside_think"),  # unclosed think covers the rest
])
def test_hermes_malformed_cases_are_reported_not_executed(body, kind):
    r = get_tool_parser("hermes").parse("x\n" + body, [CALC])
    assert r.calls == []
    assert [e.kind for e in r.errors] == [kind] and kind in ERROR_KINDS
    assert r.content == "x\n" + body  # unexecuted text stays, so the template re-renders it
    assert r.metrics()[f"agent/tool_parse_errors/{kind}"] == 1


def test_hermes_good_and_bad_mixed():
    r = get_tool_parser("hermes").parse(
        hermes_call("calc", {"expr": "2"}) + "\n<tool_call>\n{bad}\n</tool_call>", [CALC])
    assert len(r.calls) == 1 and [e.kind for e in r.errors] == ["malformed"]


def test_hermes_no_tools_given_accepts_any_name_and_string_arguments():
    r = get_tool_parser("hermes").parse('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert r.calls[0].name == "f" and r.calls[0].arguments == {"a": 1}


def coder_call(name, params):
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{inner}</function>\n</tool_call>"


def test_qwen3_coder_parses_and_types_parameters_by_schema():
    p = get_tool_parser("qwen3_coder")
    text = "Sure.\n" + coder_call("calc", {"expr": "1 + 2\nnext line", "digits": "3"})
    r = p.parse(text, [CALC])
    assert r.errors == [] and r.content == "Sure."
    assert r.calls[0].name == "calc" and r.calls[0].arguments == {"expr": "1 + 2\nnext line", "digits": 3}


@pytest.mark.parametrize("body, kind", [
    ("<tool_call>\n<parameter=expr>\n1\n</parameter>\n</tool_call>", "malformed"),  # no <function=>
    ("<tool_call>\n<function=calc>\n<parameter=expr>\n1\n</function>\n</tool_call>", "malformed"),
    (coder_call("shell", {"cmd": "ls"}), "unknown_function"),
    ("<tool_call>\n<function=calc>\n<parameter=expr>\n1", "truncated"),
    ("<think>" + coder_call("calc", {"expr": "1"}) + "</think>", "inside_think"),
])
def test_qwen3_coder_malformed_cases(body, kind):
    r = get_tool_parser("qwen3_coder").parse(body, [CALC])
    assert r.calls == [] and [e.kind for e in r.errors] == [kind] and r.content == body


# ------------------------------------------------------------------ one argument normaliser (issue 13.1)
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "include_files": {"type": "boolean"}, "limit": {"type": "integer"}, "score": {"type": "number"},
    "tags": {"type": "array"}, "filters": {"type": "object"}, "cursor": {"type": ["string", "null"]},
    "depth": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "query": {"type": "string"}}}}}


@pytest.mark.parametrize("arguments", ["null", '""', '"  "', "{}", '"{}"'])
def test_hermes_empty_arguments_are_one_call_with_no_arguments(arguments):
    r = get_tool_parser("hermes").parse('<tool_call>\n{"name": "now", "arguments": %s}\n</tool_call>' % arguments,
                                        [NOW])
    assert r.errors == [] and [(c.name, c.arguments) for c in r.calls] == [("now", {})]


def test_hermes_missing_arguments_is_a_call_with_no_arguments():
    r = get_tool_parser("hermes").parse('<tool_call>\n{"name": "now"}\n</tool_call>', [NOW])
    assert [(c.name, c.arguments) for c in r.calls] == [("now", {})]


def test_qwen3_coder_empty_function_is_a_call_with_no_arguments():
    r = get_tool_parser("qwen3_coder").parse("<tool_call>\n<function=now>\n</function>\n</tool_call>", [NOW])
    assert [(c.name, c.arguments) for c in r.calls] == [("now", {})]


CODER_TEXT = {"include_files": "True", "limit": "3", "score": "2.5", "tags": '["a", "b"]', "filters": "{'x': 1}",
              "cursor": "null", "depth": "null", "query": "True"}
TYPED = {"include_files": True, "limit": 3, "score": 2.5, "tags": ["a", "b"], "filters": {"x": 1}, "cursor": None,
         "depth": None, "query": "True"}


def test_qwen3_coder_coerces_every_type_by_schema():
    r = get_tool_parser("qwen3_coder").parse(coder_call("search", CODER_TEXT), [SEARCH])
    assert r.errors == [] and r.calls[0].arguments == TYPED
    assert isinstance(r.calls[0].arguments["limit"], int)


def test_hermes_coerces_the_same_way():
    """Both parsers and the proxy share one coercer: the same text values give the same arguments."""
    r = get_tool_parser("hermes").parse(hermes_call("search", CODER_TEXT), [SEARCH])
    assert r.errors == [] and r.calls[0].arguments == TYPED
    typed = get_tool_parser("hermes").parse(hermes_call("search", TYPED), [SEARCH])
    assert typed.calls[0].arguments == TYPED  # already-typed JSON values pass through


@pytest.mark.parametrize("text, value", [("True", True), ("false", False), ("TRUE", True), (" true ", True)])
def test_booleans_in_any_case(text, value):
    r = get_tool_parser("qwen3_coder").parse(coder_call("search", {"include_files": text}), [SEARCH])
    assert r.calls[0].arguments == {"include_files": value}


def test_a_value_that_does_not_convert_is_kept_and_the_call_still_runs():
    """Nothing dropped for a value's type (as vLLM's parsers): the tool answers with its own error."""
    for name in ("qwen3_coder", "hermes"):
        body = (coder_call("calc", {"digits": "many"}) if name == "qwen3_coder"
                else hermes_call("calc", {"digits": "many"}))
        r = get_tool_parser(name).parse(body, [CALC])
        assert r.errors == [] and r.calls[0].arguments == {"digits": "many"}


def test_proxy_history_normalisation_agrees_with_the_parsers():
    from asyncrl.agent_loop.proxy import normalize_message

    for raw, want in [(None, {}), ("", {}), ("{}", {}), ('{"include_files": "True", "limit": "3"}',
                                                        {"include_files": True, "limit": 3})]:
        msg = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": raw}}]}
        assert normalize_message(msg, [SEARCH])["tool_calls"][0]["function"]["arguments"] == want
    bad = {"role": "assistant", "tool_calls": [{"function": {"name": "search", "arguments": "{not json"}}]}
    assert normalize_message(bad, [SEARCH])["tool_calls"][0]["function"]["arguments"] == "{not json"
