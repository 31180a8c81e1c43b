"""The chat page at `GET /`, in headless Chromium (Debian's `chromium`
package) driven over the DevTools protocol on a pipe (no driver, no extra
package): the page loads with no network beyond the server, a message is
typed and sent with Enter, the answer's text is seen growing while it
streams, the conversation is kept for the next turn, the answer shows
tok/s, and Stop ends a long answer. A screenshot of the conversation is
written to $REDLITE_ARTIFACTS (default: the temp dir).

Chromium is found as `chromium` on PATH or at $REDLITE_CHROMIUM; without
it the test skips, and fails when CI is set.
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from conftest import API_KEY, BASE_URL, raw

ROOT = BASE_URL.rsplit("/v1", 1)[0]


def chromium_path() -> str:
    path = os.environ.get("REDLITE_CHROMIUM") or shutil.which("chromium")
    if not path:
        if os.environ.get("CI"):
            pytest.fail("CI is set but chromium is missing (apt-get install chromium)")
        pytest.skip("chromium is missing: apt-get install --no-install-recommends chromium")
    return path


class Browser:
    """Chromium with `--remote-debugging-pipe`: it reads commands on fd 3
    and writes answers and events on fd 4, each a JSON text ended by NUL."""

    def __init__(self, exe: str):
        self.profile = tempfile.mkdtemp(prefix="redlite-chromium-")
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()

        def fds():
            # Moved out of the way first: either may already be 3 or 4.
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile}", "--window-size=1000,760", "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.buf = b""
        self.next_id = 0
        self.session = None

    def send(self, method: str, params: dict | None = None, timeout: float = 30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self.to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\0" not in self.buf:
                chunk = os.read(self.from_child, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self.buf += chunk
            text, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(text)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise TimeoutError(method)

    def open(self, url: str):
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Page.navigate", {"url": url})
        self.wait("document.readyState === 'complete' && !!document.getElementById('input')")

    def js(self, expr: str):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr: str, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.js(expr):
                return
            time.sleep(0.05)
        raise TimeoutError(expr)

    def type_and_enter(self, text: str):
        self.js("document.getElementById('input').focus()")
        self.send("Input.insertText", {"text": text})
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                 "windowsVirtualKeyCode": 13})

    def screenshot(self, path: str):
        png = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(png))

    def close(self):
        self.proc.kill()
        self.proc.wait()
        os.close(self.to_child)
        os.close(self.from_child)
        shutil.rmtree(self.profile, ignore_errors=True)


LAST = "(() => { const a = document.querySelectorAll('.msg.assistant'); const m = a[a.length - 1];" \
       " return m ? {n: a.length, text: m.querySelector('.content') ?" \
       " m.querySelector('.content').textContent : '', done: m.dataset.done === '1'," \
       " stats: (m.querySelector('.stats') || {}).textContent || ''} : null; })()"


def watch(b: Browser, timeout: float = 180) -> tuple[dict, set[str]]:
    """Poll the last answer until it is done: (its final state, the
    distinct partial texts seen before that)."""
    partials = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = b.js(LAST)
        if s and s["done"]:
            return s, partials
        if s and s["text"]:
            partials.add(s["text"])
        time.sleep(0.02)
    raise TimeoutError("the answer did not finish")


def test_the_page_is_served_without_the_key_and_self_contained():
    status, headers, body = raw("GET", "/", key=None)
    assert status == 200
    assert headers["content-type"] == "text/html; charset=utf-8"
    csp = headers["content-security-policy"]
    assert "connect-src 'self'" in csp and "default-src 'none'" in csp, csp
    assert b"<script" in body and b"<script src" not in body


def test_a_conversation_in_headless_chromium(model_id):
    b = Browser(chromium_path())
    try:
        b.open(ROOT + "/")
        # The API key (the server under test has one), short greedy answers.
        b.js(f"""(() => {{
            const set = (id, v) => {{ const e = document.getElementById(id); e.value = v;
                                      e.dispatchEvent(new Event('change')); }};
            set('key', {json.dumps(API_KEY)}); set('temperature', '0'); set('max-tokens', '40');
        }})()""")
        b.wait(f"document.getElementById('model').textContent === {json.dumps(model_id)}", 30)

        b.type_and_enter("Write a short poem about the sea.")
        first, partials = watch(b)
        assert first["text"].strip(), first
        # Seen while streaming: several texts before the whole answer.
        assert len(partials) >= 3, partials
        assert min(len(p) for p in partials) < len(first["text"]), (partials, first)
        assert "tok/s" in first["stats"], first

        b.type_and_enter("Now make it rhyme.")
        second, _ = watch(b)
        assert second["n"] == 2 and second["text"].strip(), second
        # The page sent the whole conversation: two user turns, two answers.
        assert b.js("conversation.map(m => m.role).join(',')") == "user,assistant,user,assistant"
        users = b.js("[...document.querySelectorAll('.msg.user')].map(e => e.textContent)")
        assert users == ["Write a short poem about the sea.", "Now make it rhyme."]

        shot = os.path.join(os.environ.get("REDLITE_ARTIFACTS", tempfile.gettempdir()),
                            "chat-page.png")
        b.screenshot(shot)
        assert os.path.getsize(shot) > 1000
        print(f"screenshot: {shot}")

        # Stop: a long answer ends at once, marked stopped.
        b.js("(() => { const e = document.getElementById('max-tokens'); e.value = '400'; })()")
        b.type_and_enter("Tell me a long story.")
        b.wait("(() => { const a = document.querySelectorAll('.msg.assistant');"
               " return a.length === 3 && Number(a[2].dataset.chunks) > 0; })()")
        b.js("document.getElementById('stop').click()")
        stopped, _ = watch(b, 30)
        assert "finish: stopped" in stopped["stats"], stopped
        assert b.js("document.getElementById('send').disabled") is False
    finally:
        b.close()
