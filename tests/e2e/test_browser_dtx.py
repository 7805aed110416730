"""Hands-free in Chromium with Opus DTX: three utterances with 2 s pauses come back as three finals,
and while the microphone hears silence the page sends almost nothing.

This module's fake microphone (overriding conftest's) loops: speech, 2 s silence, speech, 2 s
silence, speech, then 15 s of silence. Run with ``pytest -s`` to see the measured bitrate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.conftest import SENTENCES, Clip, LiveServer, synthesize
from tests.e2e.conftest import FakeMicrophone, chromium_missing_reason
from tests.e2e.test_browser_rtc import _IDLE_BITRATE, IP_UDP_HEADER_BYTES, STUN_PACKET_BYTES, connect, open_page

_REASON = chromium_missing_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

KEYS = ("kitchen", "weather", "garden")
PAUSE_S = 2.0
TAIL_S = 15.0
MAX_DTX_KBPS = 3.0
MAX_WER = 0.25


@pytest.fixture(scope="module")
def fake_microphone(tmp_path_factory: pytest.TempPathFactory) -> FakeMicrophone:
    clips = [synthesize(SENTENCES[k]) for k in KEYS]
    rate = clips[0].rate_hz
    pause = np.zeros(int(rate * PAUSE_S), np.int16)
    parts: list[np.ndarray] = []
    for index, clip in enumerate(clips):
        parts += [clip.pcm22k, pause if index < len(clips) - 1 else np.zeros(int(rate * TAIL_S), np.int16)]
    audio = np.concatenate(parts)
    path = tmp_path_factory.mktemp("fake-mic-dtx") / "three.wav"
    path.write_bytes(Clip(" ".join(SENTENCES[k] for k in KEYS), audio).wav_bytes())
    speech_s = sum(len(c.pcm22k) for c in clips) / rate
    return FakeMicrophone(path, " ".join(SENTENCES[k] for k in KEYS), speech_s, len(audio) / rate)


async def test_hands_free_with_dtx_three_finals_and_a_quiet_line(
    server: LiveServer, browser: Any, fake_microphone: FakeMicrophone, wer: Callable[[str, str], float]
) -> None:
    async with open_page(browser, f"{server.url}/rtc/") as page:
        await connect(page)
        answer_sdp = await page.page.evaluate("window.mediaserver.client.pc.remoteDescription.sdp")
        assert "usedtx=1" in answer_sdp, answer_sdp
        # Start listening in the long silence at the end of the loop, so the three sentences come next.
        await page.speech_then_silence(4000, timeout_s=2 * fake_microphone.loop_s + 5)
        await page.page.click("#hands-free")
        await page.wait_for("window.mediaserver.state.handsFree", timeout_s=5)
        await page.wait_for(
            "window.mediaserver.state.transcript.filter((e) => e.final && e.text.trim()).length >= 3",
            timeout_s=fake_microphone.loop_s + 20,
        )
        state = await page.state()
        finals = [e["text"] for e in state["transcript"] if e["final"] and e["text"].strip()][:3]
        for key, text in zip(KEYS, finals, strict=True):
            assert wer(SENTENCES[key], text) <= MAX_WER, (key, finals)
        # Now in the 15 s of silence: what does listening cost?
        await page.page.wait_for_timeout(2000)
        measured: dict[str, Any] = await page.page.evaluate(
            _IDLE_BITRATE, {"ms": 6000, "stunBytes": STUN_PACKET_BYTES, "headerBytes": IP_UDP_HEADER_BYTES}
        )
        print(f"hands-free, silence, DTX: {measured}")
        assert measured["totalKbps"] is not None, measured
        assert measured["totalKbps"] <= MAX_DTX_KBPS, measured
        assert (await page.state())["handsFree"]  # still listening: the track was never paused
        assert state["errors"] == [], state["errors"]
        assert page.errors == []
