"""The example page (examples/web_chat) with ``useChat`` in Debian's Chromium, through
Playwright: send, reload mid-answer and see the answer go on, press stop.

Its own module: Playwright's sync API keeps an event loop running in the test's
thread for as long as the browser is open, which the async tests cannot share.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.web import EXAMPLE, ChildServer, in_thread
from threadline import durable
from threadline.ai import AssistantMessage
from threadline.session import MessageEntry
from threadline.stores import FileStore
from threadline.testing import ScriptedModel

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI installs it (.ci/run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def bundle() -> None:
    if shutil.which("npm") is None or not (EXAMPLE / "node_modules" / "ai").exists():
        _unavailable(f"the example's packages are not installed: npm ci in {EXAMPLE}")
    subprocess.run(["npm", "run", "--silent", "build"], cwd=EXAMPLE, check=True,
                   capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is missing (pip install -e '.[dev]')")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _assistant(page: Any) -> str:
    return str(page.evaluate(
        "() => [...document.querySelectorAll('[data-role=assistant]')].pop()?.textContent"
        " ?? ''"))


def test_s56_a_browser_page_sends_reloads_mid_answer_and_stops(bundle: None, browser: Any,
                                                               tmp_path: Path) -> None:
    store = tmp_path / "sessions"
    with ChildServer(str(store), delay=0.03, words=80) as server:
        page = browser.new_context().new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.url + "/")
        # A new chat asks to resume before its first message: nothing to resume, no error.
        page.wait_for_function("() => document.querySelector('#status')?.dataset.status"
                               " === 'ready'")
        page.fill("#input", "hello")
        page.click("#send")
        page.wait_for_function("() => [...document.querySelectorAll('[data-role=assistant]')]"
                               ".pop()?.textContent.includes('word10')")
        seen = _assistant(page)
        page.reload()  # mid-answer
        page.wait_for_function("() => document.querySelector('#status')?.dataset.status"
                               " === 'ready' && [...document.querySelectorAll("
                               "'[data-role=assistant]')].pop()?.textContent"
                               ".includes('word79')", timeout=60_000)
        after = _assistant(page)
        assert after.startswith(seen) and "word79" in after
        assert after.count("word10 ") == 1  # continued, not repeated
        chat = page.evaluate("() => localStorage.getItem('threadline-chat')")
        stored = in_thread(_messages(store, chat))
        assert stored[-1].text == after
        # Stop, mid-answer: stored on the server, the run ends, what was written stays.
        page.fill("#input", "again")
        page.click("#send")
        page.wait_for_function("() => [...document.querySelectorAll('[data-role=assistant]')]"
                               ".pop()?.textContent.includes('word5')")
        page.click("#stop")
        page.wait_for_function("() => document.querySelector('#status')?.dataset.status"
                               " === 'ready'")
        stopped = in_thread(_wait_stopped(store, chat))
        assert stopped.stop_reason == "aborted" and "word79" not in stopped.text
        page.reload()
        page.wait_for_selector(".msg.assistant.aborted")
        assert _assistant(page) == stopped.text
        assert errors == []


async def _messages(root: Path, session_id: str) -> list[Any]:
    store = FileStore(root)
    return [e.message for e in await store.load_entries(session_id)
            if isinstance(e, MessageEntry)]


async def _wait_stopped(root: Path, session_id: str) -> AssistantMessage:
    store = FileStore(root)
    runs = durable.LiveRuns(store, durable.model(ScriptedModel()))
    async for _ in runs.follow(session_id):
        pass  # to the end of the run going on, if any
    last = (await _messages(root, session_id))[-1]
    assert isinstance(last, AssistantMessage)
    return last
