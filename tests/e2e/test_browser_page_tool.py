"""The /rtc/ page's own tool in a real headless Chromium: with *Page tool* on, the assistant's call of
``set_page_color`` reaches the page over the data channel, the page changes its background and
answers, and the answer is spoken.

The fake microphone says a sentence about the kitchen lights (tests/e2e/conftest.py); the bundled
model never chooses a tool by itself, so the page is opened with ``tool_choice=required`` (as
docs/tools.md says for small models) and the colour is the model's, within the tool's enum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.e2e.conftest import Browser, FakeMicrophone, chromium_missing_reason
from tests.e2e.test_browser_rtc import connect, open_page

_REASON = chromium_missing_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


async def test_the_page_runs_its_tool_when_the_assistant_calls_it(
    server_factory: Callable[..., Any], browser: Browser, fake_microphone: FakeMicrophone
) -> None:
    server: LiveServer = await server_factory(
        assistant_temperature=0.0, assistant_max_answer_tokens=60, mcp_max_calls_per_turn=1
    )
    async with open_page(browser, f"{server.url}/rtc/?page_tool=1&tool_choice=required") as page:
        assert await page.page.is_checked("#page-tool")
        await connect(page)
        await page.wait_for("window.mediaserver.state.assistantTrack", timeout_s=10)
        await page.page.click("#assistant")
        await page.wait_for("window.mediaserver.state.assistant", timeout_s=5)
        await page.wait_for("window.mediaserver.state.toolCalls.length > 0", timeout_s=fake_microphone.loop_s + 60)
        # The user now waits for the answer in silence: the fake microphone loops its sentence, and on a
        # loaded machine the next loop would speak over every answer before its audio starts.
        await page.page.evaluate("window.mediaserver.client.track.enabled = false")
        await page.wait_for("window.mediaserver.state.answers.length > 0", timeout_s=60)
        state = await page.state()
        call = state["toolCalls"][0]
        print(f"heard {state['transcript'][:1]}, page tool call {call}, answer {state['answers'][0]}")
        assert call["name"] == "set_page_color" and call["isError"] is False, call
        assert state["pageColor"] and call["output"] == f"The page background is now {state['pageColor']}."
        background = await page.page.evaluate("document.body.style.background")
        assert state["pageColor"] in background, background
        lines = await page.page.locator("#answers li.tool").all_text_contents()
        assert any("set_page_color" in line and "(this page)" in line for line in lines), lines
        assert any(state["pageColor"] in line and line.startswith("\u2190") for line in lines), lines
        assert state["answers"][0]["text"].strip() or state["answers"][0]["heard"].strip()
        assert state["errors"] == [], state["errors"]
        assert page.errors == []
