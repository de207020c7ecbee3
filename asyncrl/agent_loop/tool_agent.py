"""ToolAgentLoop: multi-turn tool calling as a four-state machine, token-in-token-out.

::

    PENDING ──► GENERATING ──┬──────────────► TERMINATED   no call / max turns / budget spent
    render       model turn   │                    ▲
    prompt ids   (stops at    └─► PROCESSING_TOOLS ┘        budget spent after the tool output
    (tools in)   </tool_call>)       │  calls of the turn run concurrently (asyncio.gather)
                      ▲              │  tool messages -> ids (chat-template delta), mask 0
                      └──────────────┘

    response = [model turn (mask 1, logprobs)] [<|im_end|>\\n + tool turn + gen prompt (mask 0)]
               [model turn (mask 1)] ... [template tail after the last EOS (mask 0)]

Semantics from verl's ``ToolAgentLoop`` (seed ``003`` chapter 4.4). The prompt is rendered once with
the chat template and the tools of this sample (the row's ``tools``, or the registered tools, filtered
by ``extra_info.tool_selection``). Each turn sends ``prompt + response so far`` as ids; the model's ids
go into the response unchanged. Everything else (the EOS the engine did not produce because it stopped
at ``</tool_call>``, the template's ``\\n`` after EOS, the tool messages and the next generation
prompt) is cut from chat-template renders by :class:`~asyncrl.agent_loop.proxy.rendering.ChatRenderer`,
the same code the trajectory proxy uses, so the final ids equal a one-shot render of the final
conversation whenever the model's text is in the template's canonical form (DESIGN.md invariant 4).

Stopping at a call: the parser's end-of-call string (``</tool_call>``) joins ``stop_token_ids``. When
it is a single token (the embedded tokenizer, Qwen2.5/Qwen3) that id is the stop; otherwise its last
token is the stop and a turn that stopped there without the decoded text ending in the string is
continued. Stopping at the first call means one call per turn; set
``actor_rollout_ref.rollout.multi_turn.stop_on_tool_call=false`` for models that emit parallel calls
before EOS.

``sampling_params.max_tokens`` (the rollout's ``response_length``) is the budget of the *whole*
response, model and tool tokens together; the response is cut to it. Tool failures (unknown tool, bad
arguments, exceptions, timeouts) become tool messages starting with ``Error:``; they never raise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from asyncrl.agent_loop.base import AgentLoopBase, AgentLoopOutput, fill_versions, register
from asyncrl.agent_loop.proxy.rendering import ChatRenderer
from asyncrl.agent_loop.tool_parser import ERROR_KINDS, ToolCall, get_tool_parser
from asyncrl.agent_loop.tools.base import BaseTool, ToolError, select_tools, tool_schema_name
from asyncrl.config_algorithm import MultiTurnConfig  # noqa: F401  (the loop's knobs; re-exported for callers)
from asyncrl.rollout.base import SamplingParams

logger = logging.getLogger(__name__)


class AgentState(enum.Enum):
    """States of :class:`ToolAgentLoop` (see the module diagram)."""

    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    TERMINATED = "terminated"


@dataclass
class AgentData:
    """Everything that changes while one trajectory runs (passed between the state handlers).

    Per-token lists are parallel, ``(response_len,)`` each; ``versions`` holds the param version of
    each response token (for mask-0 tokens: the version of the model token before them).
    """

    request_id: str
    messages: list[dict]
    sample: dict[str, Any]
    tools: list[dict] = field(default_factory=list)
    impl: dict[str, BaseTool] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    versions: list[Optional[int]] = field(default_factory=list)
    """Engine version per response token; ``None`` on mask-0 tokens (filled in :meth:`ToolAgentLoop._output`)."""
    assistant_turns: int = 0
    pending_calls: list[ToolCall] = field(default_factory=list)
    turn_open: bool = False
    """A model turn ended (EOS or end-of-call) and its template filler is not appended yet."""
    turn_has_eos: bool = False
    """The last model turn ended with EOS (so only the template tail after it is missing)."""
    stop_reason: str = "completed"
    terminate_reason: str = ""
    metrics: Counter = field(default_factory=Counter)

    def add(self, ids: list[int], mask: int, logprobs: Optional[list[float]] = None,
            versions: Optional[list[int]] = None) -> None:
        """Append ids with one mask value; mask-0 tokens get logprob 0.0 and no version of their own."""
        n = len(ids)
        self.response_ids += ids
        self.response_mask += [mask] * n
        self.response_logprobs += list(logprobs) if mask and logprobs is not None else [0.0] * n
        self.versions += list(versions) if versions is not None else [None] * n


TOOL_ERROR_KINDS = ("unknown_tool", "too_many_calls", "tool_error", "timeout", "exception")
"""Reasons a parsed call gets an ``Error:`` tool message (``agent/tool_errors/<kind>``)."""


def _error(kind: str, message: str) -> tuple[str, str]:
    return f"Error: {message}", kind


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """Multi-turn tool calling (hermes by default) with concurrent tool execution.

    Metrics (per sample, summed over turns; every key is always present):

    - ``agent/turns``: model turns; ``agent/tool_calls``: calls sent to tools;
    - ``agent/tool_call_success_rate``: share of this sample's calls answered without error (0.0 when it
      made none; named ``agent/tool_call_success`` before session 11); ``agent/tool_call_success_count``:
      how many of its calls were answered without error;
    - ``agent/tool_parse_errors/<kind>``: call-shaped text not executed (malformed, truncated,
      inside_think) and calls to tools not offered (unknown_function);
    - ``agent/tool_errors/<kind>``: calls answered with an ``Error:`` message (:data:`TOOL_ERROR_KINDS`);
    - ``agent/generate_s``, ``agent/tool_s`` (seconds), ``agent/num_aborts``, ``agent/model_tokens``,
      ``agent/non_model_tokens``.

    Args:
        server_manager: ``async generate(request_id, prompt_ids, SamplingParams) -> TokenOutput``.
        tokenizer: HF tokenizer with a chat template that renders ``tools`` and ``tool`` messages.
        config: the experiment config; ``actor_rollout_ref.rollout.multi_turn`` is used when present.
        multi_turn: overrides the config's :class:`MultiTurnConfig`.
        tools: ``name -> BaseTool`` implementations; ``None`` uses the tool registry.
    """

    def __init__(self, server_manager: Any, tokenizer: Any, config: Any, *,
                 multi_turn: Optional[MultiTurnConfig] = None, tools: Optional[dict[str, BaseTool]] = None,
                 **kwargs: Any):
        super().__init__(server_manager, tokenizer, config, **kwargs)
        rollout = getattr(getattr(config, "actor_rollout_ref", None), "rollout", None)
        self.mt = multi_turn or getattr(rollout, "multi_turn", None) or MultiTurnConfig()
        self.tools = tools
        self.parser = get_tool_parser(self.mt.format)
        self.renderer = ChatRenderer(tokenizer)
        end_ids = list(tokenizer.encode(self.parser.end_token, add_special_tokens=False))
        self.end_stop_id = end_ids[-1]
        self.end_is_one_token = len(end_ids) == 1

    # ------------------------------------------------------------------------------------- run
    async def run(self, sampling_params: SamplingParams, **sample: Any) -> AgentLoopOutput:
        """Run the state machine for one dataset row.

        Args:
            sampling_params: ``max_tokens`` is the budget of the whole response (all turns).
            **sample: the row (``prompt`` messages, optional ``tools``, ``extra_info.tool_selection``)
                and ``request_id`` (reused for every turn, so routing stays sticky).

        Returns:
            The trajectory (``response_versions`` per token); ``extra_fields`` has ``min_global_steps``,
            ``max_global_steps`` (derived), ``messages``, ``terminate_reason``, ``stop_reason``.

        Raises:
            KeyError: ``extra_info.tool_selection`` names a tool that is not offered.
            GenerationAborted: from the client (partial rollout off); the worker drops the sample.
        """
        data = AgentData(request_id=sample["request_id"], messages=[dict(m) for m in sample["prompt"]],
                         sample=sample)
        state = AgentState.PENDING
        while state != AgentState.TERMINATED:
            if state == AgentState.PENDING:
                state = await self._handle_pending(data)
            elif state == AgentState.GENERATING:
                state = await self._handle_generating(data, sampling_params)
            elif state == AgentState.PROCESSING_TOOLS:
                state = await self._handle_processing_tools(data, sampling_params)
        return self._output(data, sampling_params.max_tokens)

    # ---------------------------------------------------------------------------------- states
    async def _handle_pending(self, data: AgentData) -> AgentState:
        """Pick this sample's tools and render the prompt once, tool schemas included.

        The ids are rendered here even when the caller passed ``prompt_ids``: they must show the
        tools selected for this sample, which a caller that only knows the row's ``tools`` can miss.
        """
        selection = (data.sample.get("extra_info") or {}).get("tool_selection")
        data.tools, data.impl = select_tools(data.sample.get("tools"), selection, self.tools)
        data.prompt_ids = self.renderer.prompt_ids(data.messages, data.tools or None)
        return AgentState.GENERATING

    async def _handle_generating(self, data: AgentData, sp: SamplingParams) -> AgentState:
        """One model turn; parse it; decide whether tools run next."""
        budget = sp.max_tokens - len(data.response_ids)
        if budget <= 0:
            data.terminate_reason = "length"
            return AgentState.TERMINATED
        t0 = time.perf_counter()
        ids, lps, versions, stop = await self._generate_turn(data, sp, budget)
        data.metrics["agent/generate_s"] += time.perf_counter() - t0
        data.assistant_turns += 1
        data.stop_reason = stop
        data.add(ids, 1, lps, versions)
        data.turn_has_eos = bool(ids) and ids[-1] == self.renderer.eos_token_id
        data.turn_open = stop != "length"  # a cut turn gets no filler: the trajectory just ends

        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        # Calls to tools not offered stay calls (answered with an error message, as verl does); a
        # second pass with the schemas gives schema-typed arguments (qwen3_coder parameter values).
        parsed = self.parser.parse(text, None)
        if data.tools and parsed.calls:
            offered = {tool_schema_name(t) for t in data.tools}
            parsed = self.parser.parse(text, list(data.tools) + sorted({c.name for c in parsed.calls} - offered))
        for err in parsed.errors:
            data.metrics[f"agent/tool_parse_errors/{err.kind}"] += 1
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in parsed.calls]
        data.messages.append(message)
        data.pending_calls = list(parsed.calls)

        if stop == "length":
            data.terminate_reason = "length"
        elif not parsed.calls:
            data.terminate_reason = "no_tool_call"
        elif len(data.response_ids) >= sp.max_tokens:
            data.terminate_reason = "length"
        elif data.assistant_turns >= self.mt.max_assistant_turns:
            data.terminate_reason = "max_turns"
        else:
            return AgentState.PROCESSING_TOOLS
        return AgentState.TERMINATED

    async def _handle_processing_tools(self, data: AgentData, sp: SamplingParams) -> AgentState:
        """Run the turn's calls concurrently; append the tool turn (mask 0)."""
        self._close_turn(data)
        calls, data.pending_calls = data.pending_calls, []
        t0 = time.perf_counter()
        results = await asyncio.gather(*[self._call_tool(c, data.impl, k) for k, c in enumerate(calls)])
        data.metrics["agent/tool_s"] += time.perf_counter() - t0
        tool_messages = []
        for call, (content, error_kind) in zip(calls, results):
            data.metrics["agent/tool_calls"] += 1
            if error_kind is None:
                data.metrics["agent/tool_call_success_count"] += 1
            else:
                data.metrics[f"agent/tool_errors/{error_kind}"] += 1
                if error_kind == "unknown_tool":
                    data.metrics["agent/tool_parse_errors/unknown_function"] += 1
            tool_messages.append({"role": "tool", "content": self._truncate(content),
                                  "tool_call_id": call.id, "name": call.name})
        data.messages += tool_messages
        data.add(self.renderer.observation_ids(tool_messages), 0)
        if len(data.response_ids) >= sp.max_tokens:
            data.terminate_reason = "length"
            return AgentState.TERMINATED
        return AgentState.GENERATING

    # --------------------------------------------------------------------------------- helpers
    async def _generate_turn(self, data: AgentData, sp: SamplingParams,
                             budget: int) -> tuple[list[int], list[float], list[int], str]:
        """Generate until EOS, the end-of-call string, or ``budget`` tokens.

        Returns:
            ``(ids, logprobs, param versions, stop_reason)`` of the turn, ``(n,)`` lists each.
        """
        stop_ids = list(sp.stop_token_ids)
        if self.mt.stop_on_tool_call and self.end_stop_id not in stop_ids:
            stop_ids.append(self.end_stop_id)
        ids: list[int] = []
        lps: list[float] = []
        versions: list[int] = []
        while True:
            turn_sp = dataclasses.replace(sp, max_tokens=budget - len(ids), stop_token_ids=stop_ids)
            out = await self.server_manager.generate(
                data.request_id, data.prompt_ids + data.response_ids + ids, turn_sp)
            new = list(out.token_ids)
            ids += new
            lps += list(out.log_probs) if out.log_probs is not None else [0.0] * len(new)
            versions += list(out.response_versions)
            data.metrics["agent/num_aborts"] += getattr(out, "num_aborts", 0)
            false_stop = (self.mt.stop_on_tool_call and not self.end_is_one_token and out.stop_reason == "completed"
                          and new and new[-1] == self.end_stop_id and new[-1] != self.renderer.eos_token_id
                          and not self.tokenizer.decode(ids).endswith(self.parser.end_token))
            if not (false_stop and len(ids) < budget):  # a multi-token end string not yet complete
                return ids, lps, versions, out.stop_reason

    async def _call_tool(self, call: ToolCall, impl: dict[str, BaseTool], index: int) -> tuple[str, Optional[str]]:
        """Execute one call; never raises.

        Returns:
            ``(tool message content, error kind or None)``; kinds: ``unknown_tool``, ``too_many_calls``,
            ``tool_error`` (:class:`ToolError`, e.g. bad arguments), ``timeout``, ``exception``.
        """
        if index >= self.mt.max_parallel_calls:
            return _error("too_many_calls", f"at most {self.mt.max_parallel_calls} calls per turn")
        tool = impl.get(call.name)
        if tool is None:
            return _error("unknown_tool", f"unknown tool {call.name!r}; available: {sorted(impl)}")
        try:
            result = await asyncio.wait_for(tool.execute(call.arguments), self.mt.tool_timeout_s)
        except ToolError as e:
            return _error("tool_error", str(e))
        except asyncio.TimeoutError:
            return _error("timeout", f"{call.name} timed out after {self.mt.tool_timeout_s:g}s")
        except Exception as e:  # a buggy tool must not kill the sample
            logger.warning("tool %s raised %r", call.name, e)
            return _error("exception", f"{type(e).__name__}: {e}")
        return str(result), None

    def _truncate(self, text: str) -> str:
        limit = self.mt.max_tool_response_length
        return text if len(text) <= limit else text[:limit] + "..."

    def _close_turn(self, data: AgentData) -> None:
        """Template filler after a model turn (mask 0): EOS if the engine stopped before it, then the tail."""
        if not data.turn_open:
            return
        close = [] if data.turn_has_eos else [self.renderer.eos_token_id]
        data.add(close + list(self.renderer.eos_tail_ids), 0)
        data.turn_open = False

    def _output(self, data: AgentData, budget: int) -> AgentLoopOutput:
        """Close the last turn, cut to the budget, and package the trajectory."""
        self._close_turn(data)  # a final EOS turn gets its "\n"; a turn stopped at a call its EOS too
        n = min(len(data.response_ids), budget)
        metrics = {f"agent/tool_parse_errors/{k}": 0 for k in ERROR_KINDS}
        metrics.update({f"agent/tool_errors/{k}": 0 for k in TOOL_ERROR_KINDS})
        metrics.update(data.metrics)
        calls = metrics.get("agent/tool_calls", 0)
        metrics["agent/tool_calls"] = calls
        metrics["agent/tool_call_success_count"] = metrics.get("agent/tool_call_success_count", 0)
        metrics["agent/tool_call_success_rate"] = metrics["agent/tool_call_success_count"] / calls if calls else 0.0
        metrics["agent/turns"] = data.assistant_turns
        metrics["agent/model_tokens"] = sum(data.response_mask[:n])
        metrics["agent/non_model_tokens"] = n - metrics["agent/model_tokens"]
        return AgentLoopOutput(
            prompt_ids=data.prompt_ids,
            response_ids=data.response_ids[:n],
            response_mask=data.response_mask[:n],
            response_logprobs=data.response_logprobs[:n],
            response_versions=fill_versions(data.versions[:n]),
            num_turns=sum(1 for m in data.messages if m["role"] != "system"),
            metrics=metrics,
            extra_fields={
                "messages": data.messages,
                "terminate_reason": data.terminate_reason,
                "stop_reason": data.stop_reason,
            },
        )
