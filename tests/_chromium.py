"""Drive a headless Chromium through the DevTools protocol (CDP), offline, for the UI tests.

    with Chromium(profile_dir) as page:
        page.goto("http://127.0.0.1:5000/#/experiments/1/runs")
        page.wait("document.querySelector('.ag-row')")        # polls a JavaScript expression
        page.click(".ag-row button")                           # a real mouse click at the element's centre
        page.screenshot(path)

The browser is Debian's ``chromium`` (CI installs it); ``executable()`` is None when there is none.
The protocol is spoken over a websocket with aiohttp (an MLflow dependency), so nothing else is
installed and nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Self

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def executable() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Chromium:
    """One headless browser with a fresh profile in ``profile``; one page."""

    def __init__(self, profile: Path, width: int = 1800, height: int = 1000, timeout: float = 60.0):
        self.profile, self.size, self.timeout = Path(profile), (width, height), timeout
        self.loop = asyncio.new_event_loop()
        self.ids = itertools.count(1)

    def __enter__(self) -> Self:
        self.process = subprocess.Popen(
            [executable(), *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             f"--window-size={self.size[0]},{self.size[1]}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {self.process.poll()})")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        self.loop.run_until_complete(self._connect(port))
        return self

    async def _connect(self, port: str) -> None:
        import aiohttp

        self.http = aiohttp.ClientSession()
        async with self.http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        page = next(t for t in targets if t["type"] == "page")
        self.ws = await self.http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)

    def __exit__(self, *exc) -> None:
        async def close():
            await self.ws.close()
            await self.http.close()
        try:
            self.loop.run_until_complete(close())
        finally:
            self.loop.close()
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def call(self, method: str, **params) -> dict:
        """One protocol command; its result."""
        async def send():
            number = next(self.ids)
            await self.ws.send_str(json.dumps({"id": number, "method": method, "params": params}))
            while True:
                message = json.loads((await self.ws.receive()).data)
                if message.get("id") == number:
                    if "error" in message:
                        raise RuntimeError(f"{method}: {message['error']}")
                    return message["result"]
        return self.loop.run_until_complete(asyncio.wait_for(send(), self.timeout))

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float | None = None):
        """Poll ``expression`` until it is truthy; its value (AssertionError with the page text on timeout)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        probe = f"(() => {{ const v = ({expression}); return v instanceof Node ? true : v; }})()"
        while time.monotonic() < deadline:
            value = self.evaluate(probe)
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {expression!r}; the page shows: "
                             f"{str(self.evaluate('document.body && document.body.innerText'))[:2000]}")

    def click(self, selector: str) -> None:
        """A mouse click at the centre of the first element matching ``selector``."""
        box = self.wait(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null; "
                        f"e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); "
                        f"return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)
