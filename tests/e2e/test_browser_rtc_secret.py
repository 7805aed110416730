"""The /rtc/ page with auth on and no real key: headless Chromium opens the URL that
``mediaserver.mint_secret`` prints (``/rtc/#client_secret=ek_...``), connects and transcribes a
push-to-talk recording (as test_browser_rtc.py's push-to-talk test, on a server with ``api_keys``);
an expired secret is refused with the server's reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

from mediaserver.mint_secret import mint, page_url
from mediaserver.transport.openai.realtime.client_secrets import ClientSecret, encode
from tests.conftest import LiveServer
from tests.e2e.conftest import Browser, FakeMicrophone, chromium_missing_reason
from tests.e2e.test_browser_rtc import MAX_WER, connect, first_text, open_page

_REASON = chromium_missing_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

KEY = "the-real-key"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def auth_server(server_factory: Callable[..., Any]) -> LiveServer:
    server: LiveServer = await server_factory(api_keys=[KEY])
    return server


async def test_push_to_talk_with_a_minted_secret(
    auth_server: LiveServer, browser: Browser, fake_microphone: FakeMicrophone, wer: Callable[[str, str], float]
) -> None:
    answer = await asyncio.to_thread(mint, auth_server.url, KEY, 600)
    url = page_url(auth_server.url, "/rtc/", answer["value"])
    loop_s = fake_microphone.loop_s
    async with open_page(browser, url) as page:
        # The menus the page fills with the secret: the models (GET /v1/models) and the voices (speak.js).
        await page.wait_for("document.querySelector('#model').options.length > 1", timeout_s=15)
        await page.wait_for("window.mediaserverSpeak && window.mediaserverSpeak.voices.length > 0", timeout_s=15)
        await connect(page)
        await page.speech_then_silence(300, timeout_s=2 * loop_s + 2, then_key="keydown")
        await page.wait_for("window.mediaserver.state.recording", timeout_s=5)
        await page.speech_then_silence(700, timeout_s=loop_s + 2, then_key="keyup")
        await page.wait_for("window.mediaserver.state.transcript.length > 0", timeout_s=30)
        state = await page.state()
        entry = first_text(state["transcript"])
        error_rate = wer(fake_microphone.text, entry["text"])
        print(f"push-to-talk with a client secret: {entry['text']!r} WER {error_rate:.2f}")
        assert error_rate <= MAX_WER, entry
        assert state["errors"] == [], state["errors"]
        assert page.errors == []


async def test_an_expired_secret_is_refused_with_the_reason(auth_server: LiveServer, browser: Browser) -> None:
    expired = encode(auth_server.app, ClientSecret("realtime", int(time.time()) - 1, {}))
    async with open_page(browser, page_url(auth_server.url, "/rtc/", expired)) as page:
        await page.page.click("#connect")
        await page.wait_for("window.mediaserver.state.errors.length > 0", timeout_s=30)
        state = await page.state()
        assert not state["connected"], state
        assert any("expired" in e for e in state["errors"]), state["errors"]
