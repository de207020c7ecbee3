"""The trainer's warning that DAPO's ``filter_groups`` keeps dropping groups, rate-limited.

With a constant reward every fetched batch's worth of groups is dropped, about once a second on the CPU recipes:
one warning per batch's worth wrote 214 lines in 4 minutes and buried the hang watchdog's diagnosis. So the first
batch's worth of the run warns at once, later ones at most every ``every_s`` seconds, each naming the groups dropped
since the previous warning.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

logger = logging.getLogger("asyncrl.trainer.fully_async_trainer")


class FilterWarning:
    """Rate limiter of the ``filter_groups dropped ...`` warning (one per trainer).

    Args:
        every_s: least seconds between two warnings after the first.
        clock: ``() -> seconds`` (``time.time``; tests pass a fake).
    """

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.time):
        self.every_s, self.clock = every_s, clock
        self.last_t: Optional[float] = None  # when the last warning was logged
        self.total_at_last = 0  # the run's dapo_no_signal drops at the last warning
        self.logged = 0  # warnings logged (tests)

    def batch_dropped(self, filtered: int, batches: int, n: int, kept: int, total: int, fg: Any) -> bool:
        """A further batch's worth of groups was dropped in this step; warn unless warned < ``every_s`` ago.

        Args:
            filtered: groups dropped in this step so far; ``batches``: ``filtered // n``; ``n``: groups a step needs.
            kept: groups kept for this step so far; ``total``: the run's ``dapo_no_signal`` drops so far.
            fg: ``algorithm.filter_groups`` (``metric``, ``max_num_gen_batches``).

        Returns:
            Whether it logged.
        """
        now = self.clock()
        if self.last_t is not None and now - self.last_t < self.every_s:
            return False
        since = ("" if self.last_t is None else
                 f"; {total - self.total_at_last} dropped since the last such warning {now - self.last_t:.0f} s ago, "
                 f"the next at most {self.every_s:.0f} s from now")
        logger.warning(
            "algorithm.filter_groups dropped %d prompt groups without reward variance in this step (%d batches' "
            "worth of %d) and kept %d: every response of those groups scored the same (metric %s); %s%s",
            filtered, batches, n, kept, fg.metric,
            f"the step fails at algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches}"
            if fg.max_num_gen_batches > 0 else
            "algorithm.filter_groups.max_num_gen_batches=0 keeps fetching for as long as that lasts (verl's "
            "unlimited); set it to K to fail the step after K batches' worth", since)
        self.last_t, self.total_at_last = now, total
        self.logged += 1
        return True


def filtered_note(dropped: int, scores: dict) -> str:
    """Why a batch never came when ``filter_groups`` dropped ``dropped`` groups (``scores``: the score every
    response of a dropped group got -> groups), for the stop reason and the summary; ``""`` when none was dropped."""
    if not dropped:
        return ""
    what = ", ".join(f"{c} all scoring {v:g}" for v, c in sorted(scores.items()))
    return (f"; algorithm.filter_groups dropped {dropped} prompt groups without reward variance ({what}: 0 = too hard "
            "or a reward that never matches the ground truth, 1 = too easy)")
