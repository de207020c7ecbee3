"""One proxy session: the token-in-token-out accumulator behind ``/s/{token}/v1/...``.

State per session (seed ``000`` section 5.3): ``prompt_ids`` + ``response_ids`` / ``response_mask`` /
``response_logprobs`` / ``response_versions``, and ``snapshot``: the normalised messages of the last request plus the
assistant message we answered with. A request is served in two steps so a bad request or a failed
generation never corrupts the session:

1. :meth:`ProxySession.plan` computes the context ids for ``messages`` *without mutating*:
   - first request: render the prompt segment (tools included) and any history segments;
   - ``messages`` extends ``snapshot`` (same tools): only the delta is rendered (mask 0);
   - otherwise (history edited, tools changed): rebuild segment by segment, reuse the model's own
     ids for assistant turns it generated, copy mask and logprobs over the common token prefix with
     the previous trajectory, and leave logprobs 0.0 after the fork; debug JSON goes to the
     trajectory dir.
2. :meth:`ProxySession.commit` appends the generation: model ids with mask 1 and their logprobs,
   then the template tail after EOS with mask 0. A generation that did not end with EOS (length
   cut) gets EOS + tail appended with mask 0, so the ids keep matching a re-render of the echoed
   conversation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from asyncrl.agent_loop.base import AgentLoopOutput, fill_versions
from asyncrl.agent_loop.proxy.rendering import ChatRenderer, RenderError

logger = logging.getLogger(__name__)


def _key(message: dict) -> str:
    return json.dumps(message, sort_keys=True, ensure_ascii=False)


@dataclass
class ProxyTrajectory:
    """What :meth:`TrajectoryProxy.pop_session` returns: the AgentLoopOutput pieces.

    Attributes:
        prompt_ids: ``(prompt_len,)`` the first request's rendered prompt (tools included).
        response_ids: ``(response_len,)`` everything after the prompt.
        response_mask: ``(response_len,)`` 1 exactly on model-generated tokens.
        response_logprobs: ``(response_len,)`` sampling logprobs, 0.0 where the mask is 0.
        num_turns: non-system messages in the final conversation (user + assistant + tool).
        metrics: ``agent/...`` counters (requests, rebuilds, tool calls, parse errors, seconds).
        messages: the final conversation (normalised), for debugging and rewards.
        response_versions: ``(response_len,)`` the engine's version of each model token; mask-0 tokens
            the version before them (see :func:`asyncrl.agent_loop.base.fill_versions`).
        extra_fields: ``ended``
            (why the proxy ended the session, or ``None``), ``engine_error`` (``repr`` of the last
            failed generation, e.g. ``GenerationAborted``, or ``None``), ``request_id``.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    num_turns: int
    metrics: dict[str, Any]
    messages: list[dict]
    extra_fields: dict[str, Any] = field(default_factory=dict)
    response_versions: list[int] = field(default_factory=list)

    def to_agent_loop_output(self, **extra_fields: Any) -> AgentLoopOutput:
        """An :class:`AgentLoopOutput` (validated); ``extra_fields`` are merged in."""
        return AgentLoopOutput(
            prompt_ids=list(self.prompt_ids), response_ids=list(self.response_ids),
            response_mask=list(self.response_mask), response_logprobs=list(self.response_logprobs),
            response_versions=list(self.response_versions), num_turns=self.num_turns, metrics=dict(self.metrics),
            extra_fields={**self.extra_fields, **extra_fields})


@dataclass
class Plan:
    """Context for one request (not yet committed)."""

    path: str  # initial / incremental / rebuild
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    messages: list[dict]
    tools: Optional[list]
    debug: Optional[dict] = None
    response_versions: list[Optional[int]] = field(default_factory=list)
    """Engine version per response token; ``None`` on tokens no generation produced."""

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids


class ProxySession:
    """State of one session; every mutation happens under :attr:`lock` (one request at a time).

    Args:
        token: the URL token (unguessable; ``secrets.token_urlsafe``).
        request_id: id passed to the engine (sticky routing key: one session, one replica).
        renderer: shared :class:`ChatRenderer`.
        max_consecutive_no_tool: end the session after this many assistant turns without a tool
            call (``None``: never), the seed's guard against chat loops.
        trajectory_dir: where rebuild diffs and the final trajectory JSON go (``None``: nowhere).
    """

    def __init__(self, token: str, request_id: str, renderer: ChatRenderer,
                 max_consecutive_no_tool: Optional[int] = None, trajectory_dir: Optional[str] = None,
                 sampling_overrides: Optional[dict] = None):
        self.token, self.request_id, self.renderer = token, request_id, renderer
        self.max_consecutive_no_tool = max_consecutive_no_tool
        self.trajectory_dir = trajectory_dir
        self.sampling_overrides = dict(sampling_overrides or {})
        self.lock = asyncio.Lock()
        self.prompt_ids: Optional[list[int]] = None
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.response_versions: list[Optional[int]] = []
        self.snapshot: list[dict] = []
        self.tools: Optional[list] = None
        # assistant messages the model produced -> (its ids, their mask, their versions), EOS included,
        # tail excluded
        self.generated: dict[str, tuple[list[int], list[int], list[Optional[int]]]] = {}
        self.metrics: Counter = Counter()
        self.no_tool_streak = 0
        self.ended: Optional[str] = None
        self.last_engine_error: Optional[BaseException] = None
        self.created = time.time()

    # ----------------------------------------------------------------------------------- plan
    def plan(self, messages: list[dict], tools: Optional[list]) -> Plan:
        """Context ids for a request's (normalised) messages; the session is not changed.

        Raises:
            RenderError: the messages cannot be rendered or end with an assistant message.
        """
        if messages[-1]["role"] == "assistant":
            raise RenderError("the last message is an assistant message; nothing to generate for")
        if self.prompt_ids is None:
            return self._build(messages, tools, "initial")
        n = len(self.snapshot)
        delta = messages[n:]
        if (tools == self.tools and len(messages) > n and messages[:n] == self.snapshot
                and all(m["role"] != "assistant" for m in delta)):
            ids = self.renderer.observation_ids(delta)
            return Plan("incremental", self.prompt_ids, self.response_ids + ids, self.response_mask + [0] * len(ids),
                        self.response_logprobs + [0.0] * len(ids), messages, tools,
                        response_versions=self.response_versions + [None] * len(ids))
        return self._rebuild(messages, tools)

    def _build(self, messages: list[dict], tools: Optional[list], path: str) -> Plan:
        """Segment-by-segment render; assistant turns the model generated keep the model's own ids."""
        segs = self.renderer.segments(messages, tools)
        ids, mask, versions = [], [], []
        for s in segs[1:]:
            own = self.generated.get(_key(messages[s.message_index])) if s.kind == "assistant" else None
            if own is not None:
                tail = s.ids[s.body_len:]
                ids += own[0] + tail
                mask += own[1] + [0] * len(tail)
                versions += own[2] + [None] * len(tail)
            else:  # observations, and assistant text the model did not write (edited / injected)
                ids += s.ids
                mask += [0] * len(s.ids)
                versions += [None] * len(s.ids)
        return Plan(path, segs[0].ids, ids, mask, [0.0] * len(ids), messages, tools, response_versions=versions)

    def _rebuild(self, messages: list[dict], tools: Optional[list]) -> Plan:
        plan = self._build(messages, tools, "rebuild")
        old, new = self.prompt_ids + self.response_ids, plan.context_ids
        common = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        op, np_ = len(self.prompt_ids), len(plan.prompt_ids)
        for k in range(max(op, np_), common):  # same tokens, same context: same mask and logprob
            plan.response_mask[k - np_] = self.response_mask[k - op]
            plan.response_logprobs[k - np_] = self.response_logprobs[k - op]
            plan.response_versions[k - np_] = self.response_versions[k - op]
        zeroed = sum(1 for k, m in enumerate(plan.response_mask) if m and k + np_ >= common)
        plan.debug = {
            "before": {"messages": self.snapshot, "tools": self.tools, "ids": old},
            "after": {"messages": messages, "tools": tools, "ids": new},
            "diff": {"common_prefix_tokens": common, "old_len": len(old), "new_len": len(new),
                     "tools_changed": tools != self.tools,
                     "first_changed_message": next((i for i, (a, b) in enumerate(zip(self.snapshot, messages))
                                                    if a != b), min(len(self.snapshot), len(messages))),
                     "mask1_tokens_without_logprobs": zeroed},
        }
        return plan

    # --------------------------------------------------------------------------------- commit
    def commit(self, plan: Plan, token_ids: list[int], logprobs: Optional[list[float]],
               assistant_message: dict, has_tool_calls: bool, versions: Sequence[int] = ()) -> None:
        """Adopt ``plan`` and append one generation (see module docstring); ``versions``: the engine's
        version of each of ``token_ids``."""
        lps = list(logprobs) if logprobs is not None else [0.0] * len(token_ids)
        if len(lps) != len(token_ids):
            raise ValueError(f"engine returned {len(lps)} logprobs for {len(token_ids)} tokens")
        if len(versions) != len(token_ids):
            raise ValueError(f"engine returned {len(versions)} versions for {len(token_ids)} tokens")
        if plan.path == "rebuild":
            self.metrics["agent/proxy/rebuilds"] += 1
            self.metrics["agent/proxy/rebuild_mask1_tokens_without_logprobs"] += \
                plan.debug["diff"]["mask1_tokens_without_logprobs"]
            self.dump_rebuild(plan.debug, self.metrics["agent/proxy/rebuilds"])
        closed = bool(token_ids) and token_ids[-1] == self.renderer.eos_token_id
        close = [] if closed else [self.renderer.eos_token_id]  # EOS the engine did not produce
        filler = close + self.renderer.eos_tail_ids
        self.prompt_ids = plan.prompt_ids
        self.response_ids = plan.response_ids + list(token_ids) + filler
        self.response_mask = plan.response_mask + [1] * len(token_ids) + [0] * len(filler)
        self.response_logprobs = plan.response_logprobs + lps + [0.0] * len(filler)
        self.response_versions = plan.response_versions + list(versions) + [None] * len(filler)
        self.tools = plan.tools
        self.snapshot = plan.messages + [assistant_message]
        self.generated[_key(assistant_message)] = (list(token_ids) + close, [1] * len(token_ids) + [0] * len(close),
                                                   list(versions) + [None] * len(close))
        self.metrics["agent/proxy/requests"] += 1
        self.metrics[f"agent/proxy/path/{plan.path}"] += 1
        self.no_tool_streak = 0 if has_tool_calls else self.no_tool_streak + 1
        if self.max_consecutive_no_tool and self.no_tool_streak >= self.max_consecutive_no_tool:
            self.ended = "max_consecutive_no_tool"
            self.metrics["agent/proxy/ended_max_consecutive_no_tool"] = 1

    # ------------------------------------------------------------------------------------ out
    def trajectory(self) -> ProxyTrajectory:
        """The accumulated trajectory (empty lists if no request was served)."""
        msgs = self.snapshot
        extra: dict[str, Any] = {"ended": self.ended, "request_id": self.request_id,
                                 "engine_error": repr(self.last_engine_error) if self.last_engine_error else None}
        return ProxyTrajectory(
            prompt_ids=list(self.prompt_ids or []), response_ids=list(self.response_ids),
            response_mask=list(self.response_mask), response_logprobs=list(self.response_logprobs),
            num_turns=sum(1 for m in msgs if m["role"] != "system"), metrics=dict(self.metrics),
            messages=list(msgs), extra_fields=extra, response_versions=fill_versions(self.response_versions))

    def _dump(self, name: str, payload: Any) -> None:
        if not self.trajectory_dir:
            return
        try:
            os.makedirs(self.trajectory_dir, exist_ok=True)
            path = os.path.join(self.trajectory_dir, f"{self.request_id}.{name}.json")
            with open(path, "w") as f:
                json.dump(payload, f, ensure_ascii=False, indent=1)
        except OSError as e:  # debugging output must never fail a request
            logger.warning("could not write %s for session %s: %s", name, self.request_id, e)

    def dump_rebuild(self, debug: dict, n: int) -> None:
        """Write ``<request_id>.rebuild<n>.{before,after,diff}.json``."""
        for part in ("before", "after", "diff"):
            self._dump(f"rebuild{n}.{part}", debug[part])

    def dump_trajectory(self) -> None:
        self._dump("trajectory", asdict(self.trajectory()))
