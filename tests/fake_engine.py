"""Test doubles for the trajectory proxy: a scripted fake engine and Qwen-style test tokenizers.

``FakeEngine`` is a fake (unit tests and benchmarks only): it "generates" a scripted assistant text
by tokenizing it with the policy tokenizer and appending EOS, with deterministic logprobs.
``qwen_test_tokenizer`` builds a small byte-level BPE tokenizer with Qwen2's pre-tokenizer regex and
the special tokens of the real Qwen chat templates shipped in ``tests/data/``.
"""

from __future__ import annotations

import asyncio
import pathlib
from typing import Callable, Optional, Sequence, Union

from asyncrl.rollout.base import SamplingParams, TokenOutput

DATA = pathlib.Path(__file__).parent / "data"
TEMPLATES = {"qwen2.5": "qwen2_5_chat_template.jinja", "qwen3": "qwen3_chat_template.jinja"}
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN2_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_CORPUS = [
    "You are a helpful assistant. You may call one or more functions to assist with the user query.",
    'The answer is 42. Let me compute that with the calculator: {"name": "calc", "arguments": {"expr": "6*7"}}',
    "What is the weather in Paris today? It is sunny, 21 degrees. Thanks!",
    "function name arguments type object properties required description string integer number",
    "I will look it up.\nThe result is shown below.\n\nDone.",
]


def qwen_test_tokenizer(template: str = "qwen2.5", vocab_size: int = 600):
    """A ``PreTrainedTokenizerFast`` with a real Qwen chat template and Qwen-like tokenization.

    Byte-level BPE (so any text round-trips), merges trained on a tiny fixed corpus (deterministic),
    Qwen2's pre-tokenizer split; ``<|im_start|>``/``<|im_end|>``/``<|endoftext|>`` special and the
    tool / think tags as added tokens, as in the real Qwen tokenizers.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = (DATA / TEMPLATES[template]).read_text()
    return fast


Script = Union[Sequence[str], Callable[[list[int]], str]]


class FakeEngine:
    """Scripted engine with the ``generate`` contract of ``LLMServerClient``.

    Args:
        tokenizer: tokenizer used to turn the scripted text into ids (EOS appended).
        script: list of assistant texts returned in order (cycled), or ``f(prompt_ids) -> text``.
        delay: seconds to sleep per call (simulates generation latency).
        fail_on: call indices (0-based) that raise ``RuntimeError`` instead of answering.
        encode: text -> ids (default: the tokenizer's canonical encoding); lets a test emit a
            valid but non-canonical tokenization, as a sampled model may.

    Attributes:
        calls: ``(request_id, prompt_ids, sampling_params)`` of every call.
    """

    def __init__(self, tokenizer, script: Script, delay: float = 0.0, fail_on: Sequence[int] = (),
                 encode: Optional[Callable[[str], list[int]]] = None):
        self.tokenizer, self.script, self.delay, self.fail_on = tokenizer, script, delay, set(fail_on)
        self.encode = encode or (lambda text: list(tokenizer.encode(text, add_special_tokens=False)))
        self.calls: list[tuple[str, list[int], SamplingParams]] = []
        self.param_version = 0

    def text_for(self, prompt_ids: list[int]) -> str:
        if callable(self.script):
            return self.script(prompt_ids)
        return self.script[(len(self.calls) - 1) % len(self.script)]

    async def generate(self, request_id: str, prompt_ids: Sequence[int],
                       sampling_params: SamplingParams) -> TokenOutput:
        self.calls.append((request_id, list(prompt_ids), sampling_params))
        if self.delay:
            await asyncio.sleep(self.delay)
        if len(self.calls) - 1 in self.fail_on:
            raise RuntimeError("fake engine failure")
        ids = self.encode(self.text_for(list(prompt_ids)))
        ids.append(self.tokenizer.eos_token_id)
        stop = "completed"
        if len(ids) > sampling_params.max_tokens:
            ids, stop = ids[: sampling_params.max_tokens], "length"
        logprobs = [-0.01 * (1 + (i * 7 + len(prompt_ids)) % 13) for i in range(len(ids))]
        top = None
        if sampling_params.top_logprobs:  # the sampled id first, then made-up runners-up
            top = [[(t, lp)] + [((t + j) % 200, lp - j) for j in range(1, sampling_params.top_logprobs)]
                   for t, lp in zip(ids, logprobs)]
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason=stop, top_logprobs=top,
                           response_versions=[self.param_version] * len(ids))

    async def engine_version(self, request_id: str) -> int:
        """The client API's version query (what the replica serving ``request_id`` holds)."""
        return self.param_version


def embedded_tokenizer() -> Optional[object]:
    """The embedded tiny model's tokenizer when its module is present (built by another issue)."""
    try:
        from asyncrl.models.tokenizer import build_tokenizer
    except ImportError:
        return None
    return build_tokenizer()
