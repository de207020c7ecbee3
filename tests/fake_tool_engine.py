"""Test doubles for the tool agent loop: a scripted fake engine and small fake tools.

``FakeToolEngine`` is a fake (unit tests only). Each *turn* it "generates" the next scripted assistant
text, tokenized with the policy tokenizer and followed by EOS, and honours the parts of the engine
contract the loop relies on: ``stop_token_ids`` (the output ends with the first stop id, included),
``max_tokens`` (cut, ``stop_reason="length"``), deterministic logprobs, a param version per call.
A call whose prompt is exactly the previous prompt + the previous output continues the same scripted
turn (what a real engine does when a client resumes after a stop it did not accept).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional, Sequence

from asyncrl.agent_loop.tools.base import BaseTool, ToolError
from asyncrl.rollout.base import SamplingParams, TokenOutput


class FakeToolEngine:
    """Scripted engine with the ``server_manager.generate`` contract.

    Args:
        tokenizer: tokenizer used to turn each scripted text into ids (EOS appended).
        turns: assistant texts, one per turn (the last one repeats).
        version: param version reported for every token (or ``fn(call_index) -> int``).
        encode: text -> ids (default: the tokenizer's canonical encoding).

    Attributes:
        calls: ``(request_id, prompt_ids, sampling_params)`` of every call.
    """

    def __init__(self, tokenizer: Any, turns: Sequence[str], version: Any = 0,
                 encode: Optional[Callable[[str], list[int]]] = None):
        self.tokenizer, self.turns = tokenizer, list(turns)
        self.version = version if callable(version) else (lambda k: version)
        self.encode = encode or (lambda text: list(tokenizer.encode(text, add_special_tokens=False)))
        self.calls: list[tuple[str, list[int], SamplingParams]] = []
        self._turn = 0
        self._rest: list[int] = []
        self._expect: Optional[list[int]] = None

    async def generate(self, request_id: str, prompt_ids: Sequence[int],
                       sampling_params: SamplingParams) -> TokenOutput:
        await asyncio.sleep(0)
        prompt = list(prompt_ids)
        k = len(self.calls)
        self.calls.append((request_id, prompt, sampling_params))
        if self._expect is None or prompt != self._expect or not self._rest:  # a new turn
            text = self.turns[min(self._turn, len(self.turns) - 1)]
            self._turn += 1
            self._rest = self.encode(text) + [self.tokenizer.eos_token_id]
        ids, stop = [], "length"
        for tok in self._rest:
            if len(ids) >= sampling_params.max_tokens:
                break
            ids.append(tok)
            if tok == self.tokenizer.eos_token_id or tok in sampling_params.stop_token_ids:
                stop = "completed"
                break
        self._rest = self._rest[len(ids):]
        self._expect = prompt + ids
        return TokenOutput(token_ids=ids, log_probs=[-0.25 - 0.01 * i for i in range(len(ids))],
                           stop_reason=stop, response_versions=[self.version(k)] * len(ids))


class ConcurrencyProbeTool(BaseTool):
    """Sleeps ``delay`` seconds and records the peak number of concurrent executions."""

    name = "probe"
    schema = {"type": "function", "function": {"name": "probe", "description": "Wait.",
                                               "parameters": {"type": "object", "properties": {}}}}

    def __init__(self, delay: float = 0.05):
        self.delay, self.active, self.peak, self.count = delay, 0, 0, 0

    async def execute(self, arguments: dict) -> str:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.active -= 1
        self.count += 1
        return f"ok{arguments.get('i', '')}"


class FailingTool(BaseTool):
    """Raises ``RuntimeError`` (a buggy tool) or :class:`ToolError` (``mode="tool_error"``)."""

    name = "fail"
    schema = {"type": "function", "function": {"name": "fail", "description": "Fail.",
                                               "parameters": {"type": "object", "properties": {}}}}

    def __init__(self, mode: str = "exception"):
        self.mode = mode

    async def execute(self, arguments: dict) -> str:
        if self.mode == "tool_error":
            raise ToolError("bad input")
        raise RuntimeError("boom")


class SlowTool(BaseTool):
    """Sleeps far longer than any test timeout."""

    name = "slow"
    schema = {"type": "function", "function": {"name": "slow", "description": "Sleep.",
                                               "parameters": {"type": "object", "properties": {}}}}

    async def execute(self, arguments: dict) -> str:
        await asyncio.sleep(60)
        return "late"
