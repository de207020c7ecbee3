#!/usr/bin/env python
"""A fresh reader's pass: open notebooks in JupyterLab in a real browser, Run All, screenshot the result.

    python scripts/browser_pass.py notebooks/01_four_modes.ipynb [more ...] [--out test-artifacts/reader]
    python scripts/browser_pass.py --full notebooks/00_quickstart.ipynb     # full size (CI unset)

Starts JupyterLab on 127.0.0.1 (random port, token auth) over a copy of ``notebooks/`` (so the glossary
links resolve), drives Debian's ``chromium`` with Playwright (no browser download), runs every cell from
the menu, waits for the kernel to go idle, saves the notebook, and writes per notebook:
``<name>.png`` (the page as left), ``<name>_NN.png`` (the notebook, screen by screen from the top, so
every output can be read), ``<name>.ipynb`` (the notebook as the browser left it) and a line in
``summary.txt`` (seconds, errors, the claims the notebook checked). Smoke size (``CI=1``) unless ``--full``.
Starts Ray and engines: run it under the machine's heavy-work lock on shared machines.
Needs ``apt-get install chromium`` and ``pip install playwright jupyterlab``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from asyncrl.net import free_port  # noqa: E402  (after the repo is on the path)

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


class Lab:
    """A JupyterLab server over ``root``; ``stop()`` shuts it (and its kernels) down."""

    def __init__(self, root: Path, env: dict[str, str], log: Path):
        self.port, self.token = free_port(), os.urandom(16).hex()
        self.base = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
             *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
             f"--LabApp.workspaces_dir={root / '.ws'}", f"--LabApp.user_settings_dir={root / '.settings'}"],
            cwd=root, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 120
        while True:
            try:
                _get(f"{self.base}/api/status?token={self.token}")
                return
            except Exception:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"JupyterLab did not start; see {log}")
                time.sleep(1)

    def kernel_states(self) -> list[str]:
        return [k["execution_state"] for k in _get(f"{self.base}/api/kernels?token={self.token}")]

    def shutdown_kernels(self) -> None:
        """Shut down every kernel (between notebooks: each notebook gets a fresh one)."""
        for k in _get(f"{self.base}/api/kernels?token={self.token}"):
            req = urllib.request.Request(f"{self.base}/api/kernels/{k['id']}?token={self.token}", method="DELETE")
            urllib.request.urlopen(req, timeout=30).close()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)  # a graceful stop (kernels too); SIGINT asks a question first
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()


def screenshots(page, stem: Path) -> list[Path]:
    """Screenshot the notebook screen by screen from the top (JupyterLab scrolls inside the page, so a
    full-page screenshot shows only the viewport); returns the files ``<stem>_NN.png``."""
    scroller = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer"
    height = page.evaluate(f"document.querySelector('{scroller}').scrollHeight")
    view = page.evaluate(f"document.querySelector('{scroller}').clientHeight")
    paths = []
    tops = list(range(0, max(height - view, 0) + 1, max(view - 80, 200)))
    if tops[-1] < height - view:
        tops.append(height - view)
    for i, top in enumerate(tops):
        page.evaluate(f"document.querySelector('{scroller}').scrollTop = {top}")
        time.sleep(0.5)
        paths.append(stem.with_name(f"{stem.name}_{i:02d}.png"))
        page.screenshot(path=str(paths[-1]))
    return paths


def _lab_settings(root: Path) -> None:
    """Attach every cell to the page (windowing off), so scrolled screenshots show rendered outputs."""
    for plugin, settings in (("notebook-extension/tracker", {"windowingMode": "none"}),
                             ("apputils-extension/notification", {"fetchNews": "false"})):
        f = root / ".settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(settings))


def run_in_browser(page, lab: Lab, name: str, timeout_s: float) -> float:
    """Open ``name``, Run All Cells, wait until the kernel has been idle for 3 polls; returns seconds."""
    url = f"{lab.base}/lab/workspaces/reader-{Path(name).stem}/tree/{name}?reset&token={lab.token}"
    for attempt in range(3):  # a cold JupyterLab (first page load) now and then never opens the notebook
        page.goto(url, timeout=120_000)
        try:
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            break
        except Exception:
            if attempt == 2:
                raise
    deadline = time.time() + 180
    while not (lab.kernel_states() and all(s == "idle" for s in lab.kernel_states())):
        if time.time() > deadline:
            raise TimeoutError(f"kernel not idle: {lab.kernel_states()}")
        time.sleep(1)
    t0 = time.time()
    for _ in range(3):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click(timeout=30_000)
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).first.click(timeout=30_000)
        if any(_busy(lab) for _ in range(30)):
            break
        page.keyboard.press("Escape")
    idle, end = 0, time.time() + timeout_s
    while time.time() < end and idle < 3:
        # the kernel reports "idle" after each widget message even while a top-level await runs, so the
        # page must also show no queued or running cell ("[*]")
        states = lab.kernel_states()
        quiet = states and all(s == "idle" for s in states) and not _cells_pending(page)
        idle = idle + 1 if quiet else 0
        time.sleep(2)
    page.keyboard.press("Control+s")
    time.sleep(3)
    return time.time() - t0


def _cells_pending(page) -> bool:
    """A cell of the open notebook is queued or running (its prompt reads ``[*]:``)."""
    return page.evaluate("""[...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputPrompt')]
                            .some(p => p.textContent.includes('*'))""")


def _busy(lab: Lab) -> bool:
    time.sleep(1)
    return "busy" in lab.kernel_states()


def report(nb_path: Path) -> tuple[list[str], list[str]]:
    """``(errors, claim lines)`` of a notebook saved by the browser."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    errors, claims = [], []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append(f"{out.get('ename')}: {out.get('evalue')}")
            text = out.get("data", {}).get("text/plain", "") if "data" in out else out.get("text", "")
            claims += [line for line in str(text).splitlines() if line.startswith(("✓ ", "✗ "))]
    return errors, claims


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--out", default=str(REPO / "test-artifacts" / "reader"))
    ap.add_argument("--full", action="store_true", help="full size (CI unset)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per notebook")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("ASYNCRL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("Debian chromium not found (apt-get install chromium)")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = out / "lab"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(REPO / "notebooks", root)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "JUPYTER_RUNTIME_DIR": str(out / "runtime"),
           "PYTHONPATH": os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)}
    env.pop("CI", None)
    if not args.full:
        env["CI"] = "1"
    _lab_settings(root)
    lab = Lab(root, env, out / "lab.log")
    failed = 0
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            try:
                for nb in args.notebooks:
                    name = Path(nb).name
                    page = browser.new_page(viewport={"width": 1400, "height": 1600})
                    seconds = run_in_browser(page, lab, name, args.timeout)
                    page.screenshot(path=str(out / f"{Path(name).stem}.png"), full_page=True)
                    screenshots(page, out / Path(name).stem)
                    page.close()
                    lab.shutdown_kernels()
                    shutil.copy(root / name, out / name)
                    errors, claims = report(out / name)
                    failed += bool(errors)
                    line = f"{name}: {seconds:.0f} s, {len(errors)} error(s) {errors[:1]}, claims: {claims}"
                    print(line, flush=True)
                    with open(out / "summary.txt", "a") as f:
                        f.write(line + "\n")
            finally:
                browser.close()
    finally:
        lab.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
