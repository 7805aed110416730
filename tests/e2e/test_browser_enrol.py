"""The /rtc/ page's "Your voice" panel in a real headless Chromium: three sentences recorded from
the (fake) microphone with MediaRecorder enrol the voice, the list shows it, and Forget deletes it.

The fake microphone loops a Piper sentence with 2 s of silence around it (tests/e2e/conftest.py),
so the three 4.5 s recordings hold 4-6 s of speech, over the 3 s an enrolment needs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import LiveServer
from tests.e2e.conftest import Browser, chromium_missing_reason
from tests.e2e.test_browser_rtc import open_page

_REASON = chromium_missing_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


async def test_three_sentences_enrol_the_voice_and_forget_deletes_it(
    server_factory: Callable[..., Any], browser: Browser, tmp_path: Path
) -> None:
    server: LiveServer = await server_factory(speakers_dir=tmp_path)
    async with open_page(browser, f"{server.url}/rtc/") as page:
        await page.wait_for("!document.getElementById('enrol-card').hidden", timeout_s=10)
        await page.page.fill("#enrol-name", "alice")
        await page.page.click("#enrol-start")
        await page.wait_for("window.mediaserverEnrol.result || window.mediaserverEnrol.error", timeout_s=60)
        enrol = await page.page.evaluate("window.mediaserverEnrol")
        assert enrol["error"] is None, enrol
        assert enrol["clips"] == 3 and enrol["result"]["name"] == "alice", enrol
        # Each recording that held enough speech to know the voice counts (one may fall in the loop's
        # silences); together they hold the 3 s an enrolment needs.
        assert 2 <= enrol["result"]["clips"] <= 3 and enrol["result"]["speech_s"] >= 3.0, enrol
        async with aiohttp.ClientSession() as http, http.get(f"{server.url}/api/speakers") as resp:
            assert [s["name"] for s in (await resp.json())["speakers"]] == ["alice"]
        items = await page.page.locator("#enrolled li").all_text_contents()
        assert len(items) == 1 and items[0].startswith(f"alice ({enrol['result']['clips']} clips"), items
        await page.page.click("#enrolled li button")
        await page.wait_for("window.mediaserverEnrol.speakers.length === 0", timeout_s=10)
        async with aiohttp.ClientSession() as http, http.get(f"{server.url}/api/speakers") as resp:
            assert (await resp.json())["speakers"] == []
        assert page.errors == [], page.errors
