"""Headless Debian Chromium driven over the Chrome DevTools protocol (websockets).

Every host name resolves to nowhere (`--host-resolver-rules`), so a page that tries the
network fails to load it; requests are also recorded, so a test can assert there were none.
The browser is started with its own profile directory and stopped by PID.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


def chromium_binary() -> str | None:
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


@dataclass
class PageLoad:
    """What a page did while it loaded: console errors, exceptions, non-local requests."""

    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    load_seconds: float = 0.0


class Chromium:
    """One headless browser and one page, driven synchronously with bounded waits."""

    def __init__(self, width: int = 1280, height: int = 2400, timeout_s: float = 30.0) -> None:
        binary = chromium_binary()
        if binary is None:
            raise RuntimeError("no chromium on PATH (make system-deps installs Debian's)")
        self.timeout_s = timeout_s
        self._profile = tempfile.mkdtemp(prefix="rlotel-chromium-")
        self._process = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # root in CI
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--host-resolver-rules=MAP * ~NOTFOUND",
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._closing = contextlib.ExitStack()
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        try:
            self._ws = self._closing.enter_context(
                connect(self._browser_url(), max_size=None, open_timeout=timeout_s)
            )
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
                "sessionId"
            ]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.call(f"{domain}.enable", session=True)
            self.call(
                "Emulation.setDeviceMetricsOverride",
                session=True,
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except Exception:
            self.close()
            raise

    def _browser_url(self) -> str:
        deadline = time.monotonic() + self.timeout_s
        assert self._process.stderr is not None
        while time.monotonic() < deadline:
            line = self._process.stderr.readline()
            if not line and self._process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._process.returncode}")
            if match := _LISTENING.search(line):
                return match.group(1)
        raise TimeoutError("chromium did not print its DevTools address")

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command and wait (bounded) for its answer, keeping events seen meanwhile."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        self._ws.send(json.dumps(message))
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = json.loads(self._ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def _wait_event(self, method: str, deadline: float) -> None:
        while not any(e.get("method") == method for e in self._events):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {method} event")
            self._events.append(json.loads(self._ws.recv(timeout=remaining)))

    def open(self, url: str, ready_expression: str) -> PageLoad:
        """Navigate, wait for the load event and then for `ready_expression` to be true."""
        self._events.clear()
        started = time.monotonic()
        deadline = started + self.timeout_s
        self.call("Page.navigate", session=True, url=url)
        self._wait_event("Page.loadEventFired", deadline)
        self.wait_for(ready_expression, deadline)
        load = PageLoad(load_seconds=time.monotonic() - started)
        for event in self._events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                load.console_errors.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                )
            elif method == "Runtime.exceptionThrown":
                load.console_errors.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                load.console_errors.append(params["entry"].get("text", ""))
            elif method == "Network.requestWillBeSent":
                request_url = params["request"]["url"]
                if not request_url.startswith(("file:", "data:", "blob:", "about:")):
                    load.requests.append(request_url)
        return load

    def wait_for(self, expression: str, deadline: float | None = None) -> None:
        """Poll the page until `expression` is true (the page's own marks), bounded."""
        deadline = deadline or time.monotonic() + self.timeout_s
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never satisfied {expression!r}")
            time.sleep(0.02)  # polling the page's own flag, not standing in for work

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        """PNG of the page."""
        shot = self.call("Page.captureScreenshot", session=True, format="png")
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        self._closing.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        if self._process.stderr is not None:
            self._process.stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def file_url(path: Path) -> str:
    return Path(path).resolve().as_uri()
