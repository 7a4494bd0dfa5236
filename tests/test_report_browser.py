"""The bundled suite's report.html in a real browser: headless Chromium, driven over the
DevTools protocol on a pipe (``--remote-debugging-pipe``: no port, no client library).

It checks that the page renders with no console error and no network request, that every
plot the evidence calls for is drawn (named in the DOM), that every link resolves, and it saves
screenshots under the run folder (``report.png``, and one per planted bug's card).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
from helpers import BundledRun

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The flags that work on a closed network (no background connections, no first-run work).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--mute-audio",
)
VIEWPORT_WIDTH = 1400
MAX_SCREENSHOT_HEIGHT = 16000
TIMEOUT_S = 60.0

# The planted bugs of probes/ and the plots their cards must show.
PLANTED = {
    "scan-state-update-tf32": {"diff-error-by-position", "diff-error-growth", "diff-module-errors"},
    "llama-down-proj-bf16": {"diff-error-by-position", "diff-error-growth", "diff-module-errors"},
    "gated-norm-tiled-vs-fused": {"bench-forest", "bench-op-diff", "bench-samples"},
    "gil-dispatch-holds-gil": {"gil-lateness", "gil-timeline", "gil-wait-shares"},
    "kv-transfer-dispatch-holds-gil": {"gap-phases", "gap-interval", "gap-bandwidth", "gap-gil-timeline"},
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.bundled(),  # the whole suite's run
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium binary on PATH (bash .ci/setup installs Debian's chromium when run as root)",
    ),
]


class DevTools:
    """A minimal DevTools protocol client over Chromium's pipe (fd 3 in, fd 4 out, messages
    separated by NUL bytes), attached to one page."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # Above any fd the child might already use, so placing them on 3 and 4 clobbers nothing.
        child_in = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 100)
        child_out = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 100)
        for fd in (to_browser_r, from_browser_w):
            os.close(fd)

        def place_pipes() -> None:
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        self.process = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=place_pipes,
        )
        os.close(child_in)
        os.close(child_out)
        self._write = os.fdopen(to_browser_w, "wb", buffering=0)
        self._read_fd = from_browser_r
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._read_fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._messages.put(None)
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                self._messages.put(json.loads(raw))

    def call(self, method: str, params: Mapping[str, Any] | None = None, *, browser: bool = False) -> dict[str, Any]:
        """Send one command (to the page session unless ``browser``) and wait for its answer,
        keeping the events that arrive meanwhile."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": dict(params or {})}
        if self.session is not None and not browser:
            message["sessionId"] = self.session
        self._write.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._messages.get(timeout=max(0.1, deadline - time.monotonic()))
            if reply is None:
                raise RuntimeError(f"chromium closed the pipe during {method}")
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result") or {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        for event in self.events:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            event = self._messages.get(timeout=max(0.1, deadline - time.monotonic()))
            if event is None:
                raise RuntimeError(f"chromium closed the pipe before {method}")
            self.events.append(event)
            if event.get("method") == method:
                return event

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, clip: Mapping[str, float] | None = None) -> None:
        import base64

        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if clip is not None:
            params["clip"] = {**clip, "scale": 1}
        data = self.call("Page.captureScreenshot", params)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, queue.Empty, OSError):
            self.call("Browser.close", browser=True)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._write.close()
        os.close(self._read_fd)


@pytest.fixture(scope="module")
def suite_run(bundled_run: BundledRun) -> Path:
    """The bundled suite's run folder: the session's one ``glmfb run`` (tests/conftest.py's
    bundled_run, which GLMFB_TEST_REPORT_RUN points at an earlier run to re-render)."""
    return bundled_run.folder


@pytest.fixture(scope="module")
def page(suite_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    assert CHROMIUM is not None
    browser = DevTools(CHROMIUM, tmp_path_factory.mktemp("chromium-profile"))
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"}, browser=True)["targetId"]
        browser.session = browser.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, browser=True
        )["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.call(f"{domain}.enable")
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": VIEWPORT_WIDTH, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
        browser.call("Page.navigate", {"url": (suite_run / "report.html").as_uri()})
        browser.wait_for("Page.loadEventFired")
        browser.evaluate("document.fonts.ready.then(() => true)")
        yield browser
    finally:
        browser.close()


def _sections(page: DevTools) -> list[dict[str, Any]]:
    return list(page.evaluate("""
        [...document.querySelectorAll('section.verdict')].map(s => ({
          verdict: s.dataset.verdict,
          probe: s.dataset.probe,
          drawn: [...s.querySelectorAll('figure[data-plot][data-state="drawn"]')]
                   .filter(f => { const svg = f.querySelector('svg');
                                  return svg && svg.getBoundingClientRect().height > 100; })
                   .map(f => f.dataset.plot),
          broken: [...s.querySelectorAll('[data-plot][data-state="error"]')].map(e => e.dataset.plot),
          captions: Object.fromEntries([...s.querySelectorAll('figure[data-plot]')]
                   .map(f => [f.dataset.plot, f.querySelector('figcaption').textContent])),
        }))
    """))


def _expected_plots(verdict: Mapping[str, Any]) -> set[str]:
    """The plots a verdict's evidence calls for, derived from run.json independently of the page."""
    kinds = {e["kind"]: e for e in verdict["evidence"]}
    artifacts = verdict.get("artifacts") or {}
    expected = set()
    if verdict["probe"] == "diff":
        expected |= {"diff-error-by-position"} if "error_by_position" in kinds else set()
        expected |= {"diff-error-growth"} if {"error_shape", "requests"} & set(kinds) else set()
        expected |= {"diff-module-errors"} if "local_error" in kinds else set()
        expected |= {"diff-counterfactual"} if "counterfactual" in kinds else set()
        expected |= {"diff-serving-requests"} if "serving_requests" in kinds else set()
        expected |= {"diff-serving-drift"} if "serving_drift" in kinds else set()
    elif verdict["probe"] == "bench":
        expected |= {"bench-forest"} if any(e["kind"] == "shape" and "change" in e for e in verdict["evidence"]) else set()
        expected |= {"bench-op-diff"} if "op_diff" in kinds else set()
        expected |= {"bench-samples"} if "samples" in artifacts else set()
    elif verdict["probe"] == "gil":
        expected |= {"gil-lateness"} if kinds.get("starvation", {}).get("p99_ms") is not None else set()
        expected |= {"gil-timeline"} if kinds.get("starvation", {}).get("windows") else set()
        holders = [t for t in kinds.get("gil_threads", {}).get("threads") or [] if not t.get("excluded")]
        waiters = kinds.get("starvation", {}).get("waiting_for_gil") or []
        expected |= {"gil-wait-shares"} if holders or waiters else set()
    elif verdict["probe"] == "gap":
        expected |= {"gap-phases"} if "phase" in kinds else set()
        expected |= {"gap-interval"} if "gap" in kinds else set()
        bandwidth = kinds.get("bandwidth", {})
        compared = bandwidth.get("page_rate_bytes_per_s") or bandwidth.get("ceiling_bytes_per_s")
        expected |= {"gap-bandwidth"} if bandwidth.get("achieved_bytes_per_s") and compared else set()
        expected |= {"gap-gil-timeline"} if "gil_verdict" in artifacts else set()
    return expected


def test_report_renders_without_console_errors_or_network(page: DevTools, suite_run: Path) -> None:
    page.evaluate("1")  # collect the events that arrived during load
    problems = []
    for event in page.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            problems.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            problems.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            problems.append(f"log: {params['entry'].get('text')}")
    assert problems == []
    requested = [e["params"]["request"]["url"] for e in page.events if e.get("method") == "Network.requestWillBeSent"]
    assert requested == [(suite_run / "report.html").as_uri()], requested
    size_bytes = (suite_run / "report.html").stat().st_size
    assert size_bytes < 5 * 1024 * 1024
    print(f"report.html: {size_bytes / 1e6:.2f} MB")


def test_every_expected_plot_is_drawn(page: DevTools, suite_run: Path) -> None:
    run = json.loads((suite_run / "run.json").read_text())
    sections = {s["verdict"]: s for s in _sections(page)}
    assert set(sections) == {v["name"] for v in run["verdicts"]}
    for verdict in run["verdicts"]:
        section = sections[verdict["name"]]
        assert section["broken"] == [], f"{verdict['name']}: plots that failed: {section['broken']}"
        assert section["drawn"], f"{verdict['name']}: no plot drawn"
        missing = _expected_plots(verdict) - set(section["drawn"])
        assert not missing, f"{verdict['name']}: evidence present but plot not drawn: {missing}"
    for name, plots in PLANTED.items():
        assert plots <= set(sections[name]["drawn"]), f"{name}: {plots - set(sections[name]['drawn'])}"


def test_growth_plot_shows_the_verdicts_exponent(page: DevTools, suite_run: Path) -> None:
    run = json.loads((suite_run / "run.json").read_text())
    verdict = next(v for v in run["verdicts"] if v["name"] == "scan-state-update-tf32")
    fit = next(e for e in verdict["evidence"] if e["kind"] == "error_shape")["fit"]
    exponent = f"{fit['loglog_exponent']:.2f}"
    caption = next(s for s in _sections(page) if s["verdict"] == verdict["name"])["captions"]["diff-error-growth"]
    assert f"length^{exponent}" in caption
    assert f"exponent {exponent}" in verdict["why"]


def test_every_link_resolves(page: DevTools, suite_run: Path) -> None:
    links = page.evaluate("""
        [...document.querySelectorAll('a[href]')].map(a => ({
          href: a.href, raw: a.getAttribute('href'),
          target: a.hash && a.href.split('#')[0] === location.href.split('#')[0]
                  ? !!document.getElementById(decodeURIComponent(a.hash.slice(1))) : null,
        }))
    """)
    artifacts = 0
    for link in links:
        if link["raw"].startswith("#"):
            assert link["target"], f"anchor {link['raw']} has no element"
            continue
        assert not os.path.isabs(link["raw"]) and "://" not in link["raw"], f"not relative: {link['raw']}"
        url = urlparse(link["href"])
        assert url.scheme == "file", link
        path = Path(unquote(url.path))
        assert path.is_file(), f"{link['raw']} does not resolve ({path})"
        assert suite_run in path.parents, f"{link['raw']} points outside the run folder"
        artifacts += 1
    assert artifacts >= 10  # every probe wrote artifacts; none of them may be a broken link
    assert not page.evaluate("document.querySelectorAll('.missing-artifact').length")


def test_screenshots(page: DevTools, suite_run: Path) -> None:
    height = page.evaluate("Math.ceil(document.documentElement.scrollHeight)")
    page.call("Emulation.setDeviceMetricsOverride",
              {"width": VIEWPORT_WIDTH, "height": min(height, MAX_SCREENSHOT_HEIGHT), "deviceScaleFactor": 1,
               "mobile": False})
    full = suite_run / "report.png"
    page.screenshot(full)
    assert full.stat().st_size > 50_000
    for name in PLANTED:
        rect = page.evaluate(
            f"(() => {{ const r = document.querySelector('section[data-verdict=\"{name}\"]').getBoundingClientRect();"
            " return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}; })()"
        )
        shot = suite_run / f"report-{name}.png"
        page.screenshot(shot, clip=rect)
        assert shot.stat().st_size > 20_000
    print(f"screenshots under {suite_run}")
