"""SingleTurnAgentLoop: render the chat prompt, generate once (token-in-token-out), done.

Semantics from the verl agent-loop design (seed ``003`` section 4.3): the prompt is rendered
with the tokenizer's chat template and sent as ids; every response token is model-generated, so
``response_mask`` is all ones; ``num_turns`` is 2 (user + assistant).
"""

from __future__ import annotations

import time
from typing import Any

from asyncrl.agent_loop.base import AgentLoopBase, AgentLoopOutput, register
from asyncrl.agent_loop.chat_encoding import render_prompt_ids
from asyncrl.rollout.base import SamplingParams


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """One user turn, one assistant turn."""

    coalesce_requests = True  # its one request may share its group's Ray call (agent.coalesce_group_requests)

    async def run(self, sampling_params: SamplingParams, **sample: Any) -> AgentLoopOutput:
        """Args: ``sample`` holds the dataset row (``prompt`` chat messages) and ``request_id``."""
        prompt_ids = sample.get("prompt_ids") or render_prompt_ids(self.tokenizer, sample["prompt"])
        t0 = time.perf_counter()
        out = await self.server_manager.generate(sample["request_id"], prompt_ids, sampling_params)
        gen_s = time.perf_counter() - t0
        n = len(out.token_ids)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=list(out.token_ids),
            response_mask=[1] * n,
            response_logprobs=list(out.log_probs) if out.log_probs is not None else [0.0] * n,
            response_versions=list(out.response_versions),
            num_turns=2,
            metrics={"agent/generate_s": gen_s, "agent/num_aborts": getattr(out, "num_aborts", 0)},
            extra_fields={"stop_reason": out.stop_reason},
        )
