"""notebooks/GLOSSARY.md: every notebook links each term on first use, and every link has its entry."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_glossary", REPO / "scripts" / "check_glossary.py")
check_glossary = importlib.util.module_from_spec(_spec)
sys.modules["check_glossary"] = check_glossary  # dataclasses look their module up
_spec.loader.exec_module(check_glossary)


def _notebook(tmp_path: Path, *markdown: str) -> Path:
    path = tmp_path / "nb.ipynb"
    cells = [{"cell_type": "markdown", "metadata": {}, "source": m} for m in markdown]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_every_notebook_links_glossary_terms_on_first_use():
    found = [m for p in sorted((REPO / "notebooks").glob("*.ipynb")) for m in check_glossary.problems(p)]
    assert not found, "\n".join(found)


def test_every_glossary_link_has_an_entry():
    anchors = {t.anchor for t in check_glossary.load_terms()}
    for p in sorted((REPO / "notebooks").glob("*.ipynb")):
        text = p.read_text(encoding="utf-8")
        for anchor in re.findall(r"GLOSSARY\.md#([\w-]+)", text):
            assert anchor in anchors, f"{p.name} links GLOSSARY.md#{anchor}, which has no entry"


def test_checker_flags_the_first_use_only_and_ignores_code_and_headings(tmp_path):
    nb = _notebook(tmp_path, "# About staleness\n\nWith `staleness_threshold` and ```\nstaleness\n```",
                   "Here staleness matters; later staleness again.")
    (msg,) = check_glossary.problems(nb)
    assert "first use of 'staleness' (markdown line 7) is not linked" in msg
    assert "[staleness](GLOSSARY.md#staleness)" in msg


def test_checker_counts_a_term_inside_a_longer_one_as_that_term(tmp_path):
    nb = _notebook(tmp_path, "The [trajectory proxy](GLOSSARY.md#trajectory-proxy) keeps a "
                             "[trajectory](GLOSSARY.md#trajectory).")
    assert check_glossary.problems(nb) == []
    wrong = _notebook(tmp_path, "A [partial rollout](GLOSSARY.md#staleness).")
    assert "is linked to GLOSSARY.md#staleness" in check_glossary.problems(wrong)[0]


def test_checker_fix_links_first_uses_in_place(tmp_path):
    nb = _notebook(tmp_path, "The MessageQueue holds prompt groups.", "The MessageQueue again.")
    assert check_glossary.problems(nb, fix=True) == []
    cells = json.loads(nb.read_text())["cells"]
    assert "".join(cells[0]["source"]) == ("The [MessageQueue](GLOSSARY.md#messagequeue) holds "
                                           "[prompt groups](GLOSSARY.md#prompt-group).")
    assert "".join(cells[1]["source"]) == "The MessageQueue again."
    assert check_glossary.problems(nb) == []
