"""Reading a vLLM ``CompletionOutput``'s logprobs into the floats a :class:`~asyncrl.rollout.base.TokenOutput` holds.

:class:`asyncrl.rollout.vllm_backend.VLLMEngine` asks vLLM for ``SamplingParams(flat_logprobs=True)``: a request's
logprobs then arrive as one ``FlatLogprobs`` (a few flat lists: ``start_indices``, ``token_ids``, ``logprobs``,
``ranks``) instead of a ``{token_id: Logprob}`` dict per token, which the front end (the replica actor's
process, on the glue's core in a pinned CPU run) builds per token and the garbage collector walks. These
readers take either form.
"""

from __future__ import annotations

from typing import Any, Sequence


def sampled_logprobs(token_ids: Sequence[int], logprobs: Any) -> list[float]:
    """The sampled tokens' logprobs, ``(len(token_ids),)`` floats (natural log), from a vLLM output.

    Args:
        token_ids: the output's ``token_ids``.
        logprobs: its ``logprobs``: a ``FlatLogprobs``, whose entries of each position start with the sampled
            token (vLLM's sampler puts it first, then the top-k), or a list of per-position dicts.

    Raises:
        ValueError: a position count other than ``len(token_ids)``, or a flat position that is empty or does not
            start with its sampled token (a vLLM that changed the layout: nothing is guessed).
    """
    if len(logprobs) != len(token_ids):
        raise ValueError(f"vLLM returned log-probs for {len(logprobs)} positions and {len(token_ids)} tokens")
    starts = getattr(logprobs, "start_indices", None)
    if starts is None:
        return [step[tok].logprob for tok, step in zip(token_ids, logprobs)]
    if any(e <= s for s, e in zip(starts, logprobs.end_indices)) or \
            [logprobs.token_ids[i] for i in starts] != list(token_ids):
        raise ValueError(f"vLLM's flat logprobs ({len(starts)} positions) do not start each position with the "
                         f"sampled token of the {len(token_ids)} generated")
    return [logprobs.logprobs[i] for i in starts]


def top_logprobs(logprobs: Any, k: int) -> list[list[tuple[int, float]]]:
    """Per position, the ``k`` most likely ``(token_id, logprob)`` pairs, most likely first (ranks 1..k; the
    sampled token appears only where it is one of them), from a ``FlatLogprobs`` or per-position dicts."""
    return [sorted(((t, lp.logprob) for t, lp in step.items() if lp.rank is not None and lp.rank <= k),
                   key=lambda x: -x[1]) for step in logprobs]
