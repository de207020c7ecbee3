"""Check that a notebook links each glossary term on its first use in the prose.

    python scripts/check_glossary.py notebooks/06_async_speedup.ipynb   # lists what to link, exit 1 if any
    python scripts/check_glossary.py                                     # every notebook
    python scripts/check_glossary.py --fix notebooks/06_async_speedup.ipynb  # link them in place

A term is a ``### heading`` of ``notebooks/GLOSSARY.md`` plus the spellings on its ``*Also:*`` line.
Its first appearance in a notebook's markdown prose (headings, code spans and code blocks do not count) must be the
text of a link to ``GLOSSARY.md#<anchor>`` (the anchor is the heading with spaces as hyphens). Matching is
case-insensitive for lower-case terms and exact for names with capitals (``MessageQueue``); a term
inside a longer identifier (``staleness_threshold``) does not count as the term.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GLOSSARY = REPO / "notebooks" / "GLOSSARY.md"
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Term:
    anchor: str
    spellings: tuple[str, ...]

    def pattern(self) -> re.Pattern:
        """Any spelling as a whole word (``-`` and ``_`` join words); case-insensitive unless it has capitals."""
        alts = [re.escape(s) if any(c.isupper() for c in s) else f"(?i:{re.escape(s)})"
                for s in sorted(self.spellings, key=len, reverse=True)]
        return re.compile(rf"(?<![\w-])(?:{'|'.join(alts)})(?![\w-])")


def load_terms(path: Path = GLOSSARY) -> list[Term]:
    """The glossary's terms: heading + ``*Also:*`` spellings, anchor = heading with spaces as hyphens."""
    terms, lines = [], path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("### "):
            head = line[4:].strip()
            spellings = [head]
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if nxt.startswith("*Also:*"):
                spellings += [s.strip() for s in nxt[len("*Also:*"):].split(",") if s.strip()]
            terms.append(Term(anchor=head.lower().replace(" ", "-"), spellings=tuple(spellings)))
    return terms


def _mask_code(text: str) -> str:
    """Blank out fenced code blocks, inline code spans and headings (same length, so offsets keep):
    a term's first use is counted in the prose."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))
    text = re.sub(r"```.*?```", blank, text, flags=re.S)
    text = re.sub(r"^#+ .*$", blank, text, flags=re.M)
    return re.sub(r"`[^`\n]*`", blank, text)


def _first_uses(cells: list[dict], terms: list[Term]) -> list[tuple[Term, int, int, str, str | None]]:
    """``(term, start, end, text, link target or None)`` of each term's first use in the joined prose."""
    prose = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    masked = _mask_code(prose)
    links = [(m.start(1), m.end(1), m.group(2)) for m in LINK.finditer(masked)]
    for m in LINK.finditer(masked):  # a link's target is not prose
        masked = masked[: m.start(2)] + " " * (m.end(2) - m.start(2)) + masked[m.end(2):]
    spans = {t.anchor: [(m.start(), m.end()) for m in t.pattern().finditer(masked)] for t in terms}
    out = []
    for term in terms:
        # a use inside a longer term ("trajectory" in "trajectory proxy") is a use of that term
        m = next((m for m in term.pattern().finditer(masked)
                  if not any(a <= m.start() and m.end() <= b and (a, b) != (m.start(), m.end())
                             for anchor, found in spans.items() if anchor != term.anchor for a, b in found)), None)
        if m is not None:
            target = next((t for a, b, t in links if a <= m.start() and m.end() <= b), None)
            out.append((term, m.start(), m.end(), m.group(0), target))
    return out


def problems(notebook: Path, terms: list[Term] | None = None, fix: bool = False) -> list[str]:
    """One message per glossary term whose first use in ``notebook``'s markdown is not linked.

    With ``fix``, unlinked first uses are wrapped in a link (in place) and no message is returned for them.
    """
    terms = load_terms() if terms is None else terms
    nb = json.loads(Path(notebook).read_text(encoding="utf-8"))
    cells = nb["cells"]
    prose = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    out, edits = [], []
    for term, start, end, text, target in _first_uses(cells, terms):
        want = f"GLOSSARY.md#{term.anchor}"
        if target is not None and target.endswith(want):
            continue
        if fix and target is None:
            edits.append((start, end, f"[{text}]({want})"))
            continue
        line = prose[:start].count("\n") + 1
        got = f"linked to {target}" if target else "not linked"
        out.append(f"{Path(notebook).name}: first use of {text!r} (markdown line {line}) is {got}; "
                   f"write [{text}]({want})")
    if edits:
        _apply(notebook, nb, edits)
    return out


def _apply(notebook: Path, nb: dict, edits: list[tuple[int, int, str]]) -> None:
    """Replace prose ranges (offsets in the joined markdown) cell by cell, last first."""
    offset, bounds = 0, []
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            text = "".join(c["source"])
            bounds.append((offset, offset + len(text), c))
            offset += len(text) + 2
    for start, end, new in sorted(edits, reverse=True):
        a, _, cell = next(b for b in bounds if b[0] <= start and end <= b[1])
        text = "".join(cell["source"])
        text = text[: start - a] + new + text[end - a:]
        cell["source"] = text.splitlines(keepends=True)
    Path(notebook).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", default=sorted(str(p) for p in (REPO / "notebooks").glob("*.ipynb")))
    ap.add_argument("--fix", action="store_true", help="link unlinked first uses in place (then review the diff)")
    args = ap.parse_args(argv)
    terms = load_terms()
    found = [msg for p in args.paths for msg in problems(Path(p), terms, fix=args.fix)]
    for msg in found:
        print(msg)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
