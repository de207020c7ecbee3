"""Retry policy for sandboxed trials, decided by error type (seed ``000`` section 3.4).

::

    attempt k (fresh proxy session + trajectory dir) -> AttemptOutcome(reward?, error_kind?)
        no error, reward present            -> done, reward
        error kind -> policy action:
            keep_reward   -> done, the verifier's reward (0.0 if it left none)
            zero_reward   -> done, reward 0.0
            retry         -> attempt k+1, or TrialFailedError after 1 + max_retries attempts

Defaults: agent timeout -> keep reward; context length exceeded -> zero reward; agent exited
non-zero -> keep reward; no verifier result -> retry; anything else -> retry. A sample whose
retries are exhausted raises :class:`TrialFailedError` with the reason, so the rollouter counts it
as failed (DESIGN.md invariant 1) instead of losing it.

Errors are classified by type; Harbor's exception types (reported by name from the out-of-process
runner) map onto the same kinds through :data:`HARBOR_ERROR_KINDS`. Standard library only.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Awaitable, Callable, Optional, Union

logger = logging.getLogger(__name__)


class ErrorKind(str, Enum):
    """What went wrong in one attempt."""

    AGENT_TIMEOUT = "agent_timeout"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    AGENT_NONZERO_EXIT = "agent_nonzero_exit"
    NO_VERIFIER_RESULT = "no_verifier_result"
    OTHER = "other"


class Action(str, Enum):
    """What the policy does about an error kind."""

    RETRY = "retry"
    KEEP_REWARD = "keep_reward"
    ZERO_REWARD = "zero_reward"


DEFAULT_ACTIONS: dict[ErrorKind, Action] = {
    ErrorKind.AGENT_TIMEOUT: Action.KEEP_REWARD,
    ErrorKind.CONTEXT_LENGTH_EXCEEDED: Action.ZERO_REWARD,
    ErrorKind.AGENT_NONZERO_EXIT: Action.KEEP_REWARD,
    ErrorKind.NO_VERIFIER_RESULT: Action.RETRY,
    ErrorKind.OTHER: Action.RETRY,
}


class TrialError(Exception):
    """Base of the errors an attempt reports; ``kind`` drives the policy."""

    kind = ErrorKind.OTHER


class AgentTimeoutError(TrialError):
    """The agent ran past ``[agent].timeout_sec``."""

    kind = ErrorKind.AGENT_TIMEOUT


class ContextLengthExceededError(TrialError):
    """The conversation no longer fits the model's context (proxy ``context_length_exceeded``)."""

    kind = ErrorKind.CONTEXT_LENGTH_EXCEEDED


class NonZeroAgentExitCodeError(TrialError):
    """The agent process exited with a non-zero status."""

    kind = ErrorKind.AGENT_NONZERO_EXIT


class VerifierResultMissingError(TrialError):
    """The verifier wrote neither ``reward.txt`` nor ``reward.json`` (or timed out)."""

    kind = ErrorKind.NO_VERIFIER_RESULT


class TrialFailedError(RuntimeError):
    """Every attempt of a sample failed with a retryable error.

    Attributes:
        reason: ``"<kind>: <message>"`` of the last attempt.
        attempts: every :class:`AttemptOutcome`, in order.
    """

    def __init__(self, reason: str, attempts: list["AttemptOutcome"]):
        super().__init__(f"sandbox trial failed after {len(attempts)} attempt(s): {reason}")
        self.reason, self.attempts = reason, attempts


HARBOR_ERROR_KINDS: dict[str, ErrorKind] = {
    "AgentTimeoutError": ErrorKind.AGENT_TIMEOUT,
    "ContextLengthExceededError": ErrorKind.CONTEXT_LENGTH_EXCEEDED,
    "NonZeroAgentExitCodeError": ErrorKind.AGENT_NONZERO_EXIT,
    "ApiError": ErrorKind.AGENT_NONZERO_EXIT,  # Harbor subclasses of NonZeroAgentExitCodeError
    "AgentAuthenticationError": ErrorKind.AGENT_NONZERO_EXIT,
    "RewardFileNotFoundError": ErrorKind.NO_VERIFIER_RESULT,
    "RewardFileEmptyError": ErrorKind.NO_VERIFIER_RESULT,
    "VerifierOutputParseError": ErrorKind.NO_VERIFIER_RESULT,
    "VerifierTimeoutError": ErrorKind.NO_VERIFIER_RESULT,
    "DownloadVerifierDirError": ErrorKind.NO_VERIFIER_RESULT,
}
"""Harbor exception class names -> kinds (anything unlisted is :attr:`ErrorKind.OTHER`)."""


def classify(error: Union[BaseException, str, None]) -> Optional[ErrorKind]:
    """The :class:`ErrorKind` of an exception or of an exception type name (``None`` -> ``None``).

    A :class:`TrialError` gives its ``kind``; otherwise the class names along the MRO are looked
    up in :data:`HARBOR_ERROR_KINDS`, so Harbor's own exception types classify without importing
    Harbor. Unknown errors are :attr:`ErrorKind.OTHER`.
    """
    if error is None:
        return None
    if isinstance(error, str):
        return HARBOR_ERROR_KINDS.get(error, ErrorKind.OTHER)
    if isinstance(error, TrialError):
        return error.kind
    for cls in type(error).__mro__:
        if cls.__name__ in HARBOR_ERROR_KINDS:
            return HARBOR_ERROR_KINDS[cls.__name__]
    return ErrorKind.OTHER


@dataclass
class AttemptOutcome:
    """One attempt's result, as the policy sees it.

    Attributes:
        reward: the verifier's scalar reward, ``None`` when it left none.
        error_kind: ``None`` when the attempt had no error.
        error: human-readable error (``"TypeName: message"``).
        payload: whatever the caller wants back (e.g. the trajectory), untouched by the policy.
        attempt: 0-based attempt index.
    """

    reward: Optional[float] = None
    error_kind: Optional[ErrorKind] = None
    error: str = ""
    payload: Any = None
    attempt: int = 0


@dataclass
class Decision:
    """Final verdict on a sample: the reward it trains with and why."""

    reward: float
    outcome: AttemptOutcome
    attempts: list[AttemptOutcome]
    action: Optional[Action] = None


@dataclass
class RetryPolicy:
    """Configurable error-type -> action table.

    Attributes:
        max_retries: retries after the first attempt (at most ``1 + max_retries`` attempts).
        actions: overrides of :data:`DEFAULT_ACTIONS`, by kind name (``{"agent_timeout": "retry"}``).
    """

    max_retries: int = 2
    actions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        kinds, acts = {k.value for k in ErrorKind}, {a.value for a in Action}
        for k, a in self.actions.items():
            if k not in kinds:
                raise ValueError(f"unknown error kind {k!r} in retry actions; known: {sorted(kinds)}")
            if a not in acts:
                raise ValueError(f"unknown retry action {a!r} for {k!r}; known: {sorted(acts)}")

    def action(self, kind: ErrorKind) -> Action:
        """The action for an error kind (override, else default)."""
        return Action(self.actions[kind.value]) if kind.value in self.actions else DEFAULT_ACTIONS[kind]

    async def run(self, attempt_fn: Callable[[int], Awaitable[AttemptOutcome]],
                  reraise: tuple[type[BaseException], ...] = ()) -> Decision:
        """Run attempts until one is final.

        Args:
            attempt_fn: ``await attempt_fn(k)`` runs attempt ``k`` (0-based) with fresh resources
                and returns its :class:`AttemptOutcome`; an exception it raises is classified
                like a reported error (``asyncio.CancelledError`` propagates).
            reraise: exception types that end the sample at once instead (e.g. the client's
                ``GenerationAborted``: the rollouter drops such samples with their reason).

        Returns:
            The :class:`Decision` (reward, final outcome, every attempt).

        Raises:
            TrialFailedError: the last allowed attempt still asked for a retry.
        """
        attempts: list[AttemptOutcome] = []
        for k in range(1 + self.max_retries):
            try:
                outcome = await attempt_fn(k)
            except asyncio.CancelledError:
                raise
            except reraise:
                raise
            except Exception as e:  # a failed attempt is data for the policy, not a crash
                logger.warning("sandbox attempt %d raised %s: %s", k, type(e).__name__, e)
                outcome = AttemptOutcome(error_kind=classify(e), error=f"{type(e).__name__}: {e}")
            outcome.attempt = k
            if outcome.error_kind is None and outcome.reward is None:
                outcome.error_kind, outcome.error = ErrorKind.NO_VERIFIER_RESULT, "verifier wrote no reward"
            attempts.append(outcome)
            if outcome.error_kind is None:
                return Decision(float(outcome.reward), outcome, attempts)
            act = self.action(outcome.error_kind)
            if act is Action.KEEP_REWARD:
                return Decision(float(outcome.reward or 0.0), outcome, attempts, act)
            if act is Action.ZERO_REWARD:
                return Decision(0.0, outcome, attempts, act)
            logger.info("sandbox attempt %d: %s (%s) -> retry", k, outcome.error_kind.value, outcome.error)
        last = attempts[-1]
        raise TrialFailedError(f"{last.error_kind.value}: {last.error}", attempts)
