"""RolloutSample: what travels on the MessageQueue (one prompt group, ``rollout.n`` trajectories).

A sample carries its parameter versions, timings and agent-loop metrics, so the trainer never has
to guess where it came from (DESIGN.md section 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from asyncrl.agent_loop.base import AgentLoopOutput


@dataclass
class RolloutSample:
    """One prompt group.

    Attributes:
        uid: unique id of this prompt group (also the request-id prefix of its responses).
        seq: position of the prompt in the stream taken from the dataloader (0, 1, ...; continues
            across a resume); the key of :class:`~asyncrl.accounting.Ledger`.
        index: dataset row index the prompt came from.
        data_source: the row's ``data_source`` (selects the reward function).
        ground_truth: ``reward_model.ground_truth`` of the row.
        outputs: ``rollout.n`` :class:`AgentLoopOutput`, rewards filled in.
        start_version: rollouter parameter version when generation started.
        timings: seconds since epoch: ``taken`` (left the dataloader), ``started``, ``finished``,
            ``enqueued``; the trainer adds ``dequeued``.
        metrics: aggregated agent-loop metrics of the group.
    """

    uid: str
    seq: int
    index: int
    data_source: str
    ground_truth: Any
    outputs: list[AgentLoopOutput]
    start_version: int
    timings: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [float(o.reward_score or 0.0) for o in self.outputs]

    @property
    def min_global_steps(self) -> Optional[int]:
        vals = [o.extra_fields.get("min_global_steps") for o in self.outputs]
        vals = [v for v in vals if v is not None]
        return min(vals) if vals else None

    @property
    def max_global_steps(self) -> Optional[int]:
        vals = [o.extra_fields.get("max_global_steps") for o in self.outputs]
        vals = [v for v in vals if v is not None]
        return max(vals) if vals else None

    @property
    def is_partial(self) -> bool:
        """True when some response's tokens come from more than one parameter version."""
        return any(o.extra_fields.get("min_global_steps") != o.extra_fields.get("max_global_steps") for o in self.outputs)


def trajectory_view(sample: RolloutSample, tokenizer) -> dict:
    """The first response of ``sample`` for the mask inspector: ids, mask, log-probs, versions and the
    decoded token strings (one per id)."""
    o = sample.outputs[0]
    return {"uid": sample.uid, "index": sample.index, "reward": o.reward_score, "num_turns": o.num_turns,
            "prompt_ids": list(o.prompt_ids), "response_ids": list(o.response_ids),
            "response_mask": list(o.response_mask), "response_logprobs": list(o.response_logprobs),
            "response_versions": list(o.response_versions),
            "prompt_tokens": [tokenizer.decode([t]) for t in o.prompt_ids],
            "response_tokens": [tokenizer.decode([t]) for t in o.response_ids],
            "min_global_steps": o.extra_fields.get("min_global_steps"),
            "max_global_steps": o.extra_fields.get("max_global_steps")}
