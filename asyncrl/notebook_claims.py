"""A teaching notebook's claims: each statement of its text checked on the run beside it.

Used through :class:`asyncrl.notebook.NotebookSession` (``nb.claim(...)``, ``nb.claims()``).
"""

from __future__ import annotations

import dataclasses
import html


class ClaimFailed(AssertionError):
    """A notebook's text says something its own run does not show (the notebook stops here)."""


@dataclasses.dataclass
class Claim:
    """One claim of a chapter, checked on the run beside it.

    Attributes:
        text: the claim as the markdown states it.
        ok: whether the run shows it.
        evidence: the measured value(s) that decide it.
        unchecked: why this run cannot decide it (too short a run for a measured speed, say); the claim is
            shown as not checked, neither passed nor failed (``ok`` is False).
    """

    text: str
    ok: bool
    evidence: str = ""
    unchecked: str = ""

    def line(self, evidence: bool = True) -> str:
        if self.unchecked:
            return f"– {self.text}  (not checked: {self.unchecked})"
        mark = "✓" if self.ok else "✗"
        return f"{mark} {self.text}" + (f"  ({self.evidence})" if evidence and self.evidence else "")


class Claims:
    """Display of a notebook's checked claims."""

    def __init__(self, claims: list[Claim]):
        self.items = claims

    def __repr__(self) -> str:
        return "\n".join(c.line(evidence=False) for c in self.items) or "no claims checked"

    def _repr_html_(self) -> str:
        rows = "".join(f"<li>{html.escape(c.line(evidence=False))}</li>" for c in self.items)
        return f"<b>Claims checked on this run</b><ul style='list-style:none;padding-left:0'>{rows}</ul>"
