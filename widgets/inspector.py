"""TrajectoryInspector: one trajectory, token by token, with its loss mask, logprobs and versions.

::

    rollouter.trajectories(n) -> [{prompt_ids, response_ids, response_mask, response_logprobs,
                                   response_param_versions, prompt_tokens, response_tokens,
                                   reward, num_turns, min_global_steps, max_global_steps, uid}]
        --> trajectory_model(traj) --> token spans: class "tok m1" (model-generated, trained on)
                                                    class "tok m0" (tool / observation / template)
                                                    class "tok prompt"
                                       shade = p = exp(logprob); hover title = id, mask, logprob, version
                                       turn boundaries at ``<|im_start|>`` (else at mask 0 -> 1)
                                       length check: ids == mask == logprobs (DESIGN.md section 3)
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from widgets._common import SnapshotView, as_int

TURN_MARKER = "<|im_start|>"


@dataclass
class Token:
    """One rendered token."""

    index: int
    text: str
    token_id: int
    mask: Optional[int]  # None for prompt tokens
    logprob: Optional[float] = None
    version: Optional[int] = None
    turn_start: bool = False

    @property
    def css_class(self) -> str:
        kind = "prompt" if self.mask is None else f"m{1 if self.mask else 0}"
        return f"tok {kind}" + (" turn" if self.turn_start else "")


@dataclass
class TrajectoryModel:
    """What :class:`TrajectoryInspector` shows for one trajectory."""

    uid: str
    reward: Optional[float]
    num_turns: Optional[int]
    prompt: list[Token]
    response: list[Token]
    lengths: dict[str, int]
    warnings: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    min_version: Optional[int] = None
    max_version: Optional[int] = None
    turn_starts: list[int] = field(default_factory=list)

    @property
    def lengths_ok(self) -> bool:
        return not self.warnings

    @property
    def model_tokens(self) -> int:
        return sum(1 for t in self.response if t.mask)


def check_lengths(traj: dict) -> tuple[dict[str, int], list[str]]:
    """Contract check: ``len(response_ids) == len(response_mask) == len(response_logprobs)``.

    Also compares decoded tokens and per-token versions when present. Returns ``(lengths, warnings)``.
    """
    lengths = {k: len(traj.get(k) or []) for k in ("response_ids", "response_mask", "response_logprobs")}
    for opt in ("response_tokens", "response_param_versions"):
        if traj.get(opt):
            lengths[opt] = len(traj[opt])
    warnings = []
    n = lengths["response_ids"]
    bad = {k: v for k, v in lengths.items() if v != n}
    if bad:
        warnings.append("length mismatch: response_ids has %d, but %s" % (
            n, ", ".join(f"{k} has {v}" for k, v in bad.items())))
    mask, lps = traj.get("response_mask") or [], traj.get("response_logprobs") or []
    nonzero = sum(1 for m, lp in zip(mask, lps) if not m and lp not in (0, 0.0, None))
    if nonzero:
        warnings.append(f"{nonzero} mask-0 tokens carry a non-zero logprob (contract: 0.0 where mask is 0)")
    return lengths, warnings


def _texts(tokens: Optional[Sequence[str]], ids: Sequence[int]) -> list[str]:
    tokens = list(tokens or [])
    return [tokens[i] if i < len(tokens) else f"<{t}>" for i, t in enumerate(ids)]


def trajectory_model(traj: dict, turn_marker: str = TURN_MARKER) -> TrajectoryModel:
    """Pure model of one trajectory dict (see the module docstring for the fields).

    Missing entries (a short mask or logprob list) are rendered as unknown rather than raising,
    and reported in ``warnings``.
    """
    lengths, warnings = check_lengths(traj)
    p_ids = list(traj.get("prompt_ids") or [])
    r_ids = list(traj.get("response_ids") or [])
    mask = list(traj.get("response_mask") or [])
    lps = list(traj.get("response_logprobs") or [])
    vers = list(traj.get("response_param_versions") or [])
    prompt = [Token(i, s, as_int(t), None, turn_start=turn_marker in s)
              for i, (t, s) in enumerate(zip(p_ids, _texts(traj.get("prompt_tokens"), p_ids)))]
    response, turn_starts, prev = [], [], 0
    marker_seen = any(turn_marker in s for s in (traj.get("response_tokens") or []))
    for i, (t, s) in enumerate(zip(r_ids, _texts(traj.get("response_tokens"), r_ids))):
        m = as_int(mask[i]) if i < len(mask) else None
        start = (turn_marker in s) if marker_seen else (i > 0 and m == 1 and prev == 0)
        if start:
            turn_starts.append(i)
        response.append(Token(i, s, as_int(t), m, float(lps[i]) if i < len(lps) and lps[i] is not None else None,
                              as_int(vers[i]) if i < len(vers) and vers[i] is not None else None, start))
        prev = m
    used = sorted({t.version for t in response if t.mask and t.version is not None})
    lo, hi = traj.get("min_global_steps"), traj.get("max_global_steps")
    return TrajectoryModel(
        uid=str(traj.get("uid", "")), reward=traj.get("reward"), num_turns=traj.get("num_turns"),
        prompt=prompt, response=response, lengths=lengths, warnings=warnings, versions=used,
        min_version=lo if lo is not None else (used[0] if used else None),
        max_version=hi if hi is not None else (used[-1] if used else None), turn_starts=turn_starts)


def token_style(tok: Token) -> str:
    """Inline background for a response token: mask-1 tokens shaded by ``p = exp(logprob)``.

    Confident tokens are deep blue, unlikely ones pale; mask-0 tokens keep their class colour.
    """
    if tok.mask != 1:
        return ""
    p = math.exp(tok.logprob) if tok.logprob is not None and tok.logprob <= 0 else 1.0
    alpha = 0.12 + 0.55 * max(0.0, min(1.0, p))
    return f"background: rgba(24,144,255,{alpha:.2f})"


def token_title(tok: Token) -> str:
    parts = [f"#{tok.index}", f"id={tok.token_id}", repr(tok.text)]
    if tok.mask is not None:
        parts.append(f"mask={tok.mask}")
    if tok.logprob is not None:
        parts.append(f"logprob={tok.logprob:.3f} (p={math.exp(min(0.0, tok.logprob)):.2f})")
    if tok.version is not None:
        parts.append(f"v{tok.version}")
    return " ".join(parts)


def tokens_html(tokens: list[Token]) -> str:
    """``<span class="tok m1|m0|prompt" title=...>`` per token; newlines shown as ``↵`` + break."""
    out = []
    for t in tokens:
        text = html.escape(t.text).replace("\n", "↵\n")
        style = token_style(t)
        style = f' style="{style}"' if style else ""
        out.append(f'<span class="{t.css_class}" data-i="{t.index}"{style} title="{html.escape(token_title(t))}">{text}</span>')
    return "".join(out)


def header_html(m: TrajectoryModel) -> str:
    span = ("&ndash;" if m.min_version is None else
            f"v{m.min_version}" if m.min_version == m.max_version else
            f"<b>partial rollout v{m.min_version} &rarr; v{m.max_version}</b>")
    check = ('<span class="ok">lengths agree (%d tokens)</span>' % m.lengths.get("response_ids", 0)
             if m.lengths_ok else "".join(f'<div class="warn">&#9888; {html.escape(w)}</div>' for w in m.warnings))
    return (f"<div>sample <code>{html.escape(m.uid)}</code> &middot; reward <b>{m.reward}</b> &middot; "
            f"turns {m.num_turns} &middot; {m.model_tokens}/{len(m.response)} model tokens &middot; "
            f"versions {span} {m.versions if len(m.versions) > 1 else ''}</div><div>{check}</div>"
            '<div class="legend"><span class="tok prompt">prompt</span><span class="tok m1" '
            'style="background:rgba(24,144,255,.5)">mask 1 (model, shade = p)</span>'
            '<span class="tok m0">mask 0 (tool / template)</span><span class="turn">turn start</span></div>')


class TrajectoryInspector(SnapshotView):
    """Pick a recent trajectory and read it token by token.

    Args:
        trajectories: initial list of trajectory dicts (``rollouter.trajectories(n)``).
        show_prompt: render the prompt tokens too (grey).

    ``update(snapshot)`` takes a snapshot with a ``"trajectories"`` list (the Dashboard adds it) or
    the list itself; the selection sticks to the chosen ``uid`` while new trajectories arrive.
    """

    title = "Trajectory inspector"

    def __init__(self, trajectories: Optional[list[dict]] = None, show_prompt: bool = True):
        super().__init__()
        self.trajectories: list[dict] = []
        self.selected: Optional[str] = None
        self.show_prompt = show_prompt
        if trajectories:
            self.update(trajectories)

    def _compute(self, snapshot: Any) -> Optional[TrajectoryModel]:
        trajs = snapshot.get("trajectories") if isinstance(snapshot, dict) else snapshot
        if trajs is not None:
            self.trajectories = list(trajs)
        if not self.trajectories:
            return None
        uids = [str(t.get("uid", i)) for i, t in enumerate(self.trajectories)]
        if self.selected not in uids:
            self.selected = uids[-1]
        return trajectory_model(self.trajectories[uids.index(self.selected)])

    def select(self, key: "int | str") -> Optional[TrajectoryModel]:
        """Select by position in the list or by ``uid``; returns the new model."""
        if isinstance(key, int):
            key = str(self.trajectories[key].get("uid", key))
        self.selected = str(key)
        return self.update({"trajectories": None})

    def _body_html(self) -> str:
        m = self.model
        toks = (tokens_html(m.prompt) if self.show_prompt else "") + tokens_html(m.response)
        return header_html(m) + f'<div class="toks">{toks}</div>'

    def to_html(self) -> str:
        from widgets._common import wrap

        if self.model is None:
            return wrap('<span class="muted">no trajectories yet</span>', self.title)
        return wrap(self._body_html(), self.title)

    def _build(self) -> Any:
        import ipywidgets as w

        self._pick = w.Dropdown(description="sample", layout=w.Layout(width="420px"))
        self._pick.observe(self._on_pick, names="value")
        self._view = w.HTML()
        return w.VBox([self._pick, self._view])

    def _on_pick(self, change: dict) -> None:
        if change["new"] and change["new"] != self.selected:
            self.select(change["new"])

    def _refresh(self) -> None:
        options = [(f"{t.get('uid', i)}  reward={t.get('reward')}  turns={t.get('num_turns')}  "
                    f"v{t.get('min_global_steps')}-{t.get('max_global_steps')}", str(t.get("uid", i)))
                   for i, t in enumerate(self.trajectories)]
        with self._pick.hold_trait_notifications():
            if list(self._pick.options) != options:
                self._pick.options = options
            if self.selected is not None:
                self._pick.value = self.selected
        self._view.value = self.to_html()

    def _plot(self) -> Any:
        from widgets.static import plot_tokens

        return plot_tokens(self.model, show_prompt=self.show_prompt)

    def _summary(self) -> str:
        m = self.model
        if m is None:
            return "no trajectories yet"
        return (f"uid={m.uid!r}, reward={m.reward}, tokens={len(m.response)} ({m.model_tokens} mask=1), "
                f"versions={m.min_version}..{m.max_version}, lengths_ok={m.lengths_ok}")
