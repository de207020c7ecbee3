"""The embedded tiny model: tokenizer round trip, chat template, transformers load, card."""

import json

import pytest
import torch

from asyncrl.models import EMBEDDED_MODEL_DIR, load_tokenizer
from asyncrl.models.tokenizer import SPECIAL_TOKENS, TOOL_TOKENS, build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_saved_tokenizer_matches_builder(tok):
    built = build_tokenizer()
    assert len(tok) == len(built) == 265
    s = "What is 47+38?\n47+38=85\n#### 85 {\"a\": [1, 2]}"
    assert tok.encode(s, add_special_tokens=False) == built.encode(s, add_special_tokens=False)


@pytest.mark.parametrize("s", [
    "47+38=85\n#### 85",
    "  leading and trailing spaces  \n\n\ttab",
    "".join(chr(c) for c in range(32, 127)) + "\n",
    'Punctuation: {"name": "calc", "arguments": {"expr": "1+2"}}',
    "unicode é 中文 ✓",
])
def test_round_trip(tok, s):
    ids = tok.encode(s, add_special_tokens=False)
    assert tok.decode(ids) == s
    if s.isascii():
        assert ids == list(s.encode())  # one token per character, id = byte value


def test_special_and_tool_tokens_are_single_ids(tok):
    for t in SPECIAL_TOKENS + TOOL_TOKENS:
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id == 258 and tok.pad_token_id == 256
    ids = tok.encode("<|im_start|>a<tool_call>b</tool_call><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "a<tool_call>b</tool_call>"  # tool tags survive
    assert tok.encode("ab", add_special_tokens=True) == [97, 98]  # no BOS added


def test_chat_template_two_messages(tok):
    msgs = [{"role": "user", "content": "What is 1+2?"}, {"role": "assistant", "content": "1+2=3\n#### 3"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>user\nWhat is 1+2?<|im_end|>\n<|im_start|>assistant\n1+2=3\n#### 3<|im_end|>\n"
    )
    assert tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nWhat is 1+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    sys_msgs = [{"role": "system", "content": "Be brief."}] + msgs[:1]
    assert tok.apply_chat_template(sys_msgs, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1+2?<|im_end|>\n"
    )


def test_chat_template_tool_call_conversation(tok):
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    msgs = [
        {"role": "user", "content": "What is 1+2?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expr": "1+2"}}}]},
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "#### 3"},
    ]
    expected = (
        "<|im_start|>system\n# Tools\n<tools>\n"
        '{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}\n'
        "</tools>\nTo call a tool reply with <tool_call>\n"
        '{"name": <name>, "arguments": <args-json>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is 1+2?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": {"expr": "1+2"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n#### 3<|im_end|>\n"
    )
    assert tok.apply_chat_template(msgs, tools=tools, tokenize=False) == expected
    # string arguments (OpenAI wire format) render verbatim
    msgs[1]["tool_calls"][0]["function"]["arguments"] = '{"expr": "1+2"}'
    assert tok.apply_chat_template(msgs, tools=tools, tokenize=False) == expected


def test_model_loads_with_transformers_and_answers_in_format(tok):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR, local_files_only=True)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.float32
    assert model.config.vocab_size >= len(tok) and model.config.tie_word_embeddings
    assert model.generation_config.eos_token_id == tok.eos_token_id
    text = tok.apply_chat_template([{"role": "user", "content": "What is 47+38?"}], tokenize=False,
                                   add_generation_prompt=True)
    enc = tok(text, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    gen = out[0, enc["input_ids"].shape[1]:].tolist()
    assert gen[-1] == tok.eos_token_id
    assert tok.decode(gen, skip_special_tokens=True).startswith("47+38=")
    assert "\n#### " in tok.decode(gen)


def test_card_records_partial_accuracy():
    card = json.loads((EMBEDDED_MODEL_DIR / "card.json").read_text())
    assert 0.2 <= card["eval"]["greedy_accuracy"] <= 0.6
    assert card["eval"]["eval_size"] == 200
    assert card["param_count"] > 0 and card["vocab_size"] % 16 == 0
    assert (EMBEDDED_MODEL_DIR / "model.safetensors").stat().st_size < 20 * 2**20
