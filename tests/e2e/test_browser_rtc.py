"""The browser client (static/rtc/) against a live server, in a real headless Chromium.

The fake microphone loops ``silence, sentence, silence`` (see conftest.py). The page's local
microphone level (``client.micLevel()``, a WebAudio analyser on the capture track, which keeps
running while the RTP sender is paused) tells where in that loop the browser is, so push-to-talk
can start in the pause before the sentence and stop in the pause after it, as a person would. The
key is pressed and released by the page itself, in the same step that sees the pause
(``speech_then_silence(..., then_key=...)``): a release sent from the test afterwards could arrive
late, after the looping file has started the sentence again, and the recording would hold it twice.

Run with ``pytest -s tests/e2e`` to see the measured idle bitrate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import LiveServer
from tests.e2e.conftest import Browser, FakeMicrophone, chromium_missing_reason

_REASON = chromium_missing_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench-results"
MAX_WER = 0.25
MAX_IDLE_KBPS = 5.0

# Levels of the fake microphone as the page measures them (dBFS RMS over ~20 ms): Piper speech
# sits around -10…-40 dB with short dips, the padding is digital silence (≈ -120 dB).
SPEECH_DB = -45.0
SILENCE_DB = -70.0

_WAIT_SPEECH_THEN_SILENCE = """
async ({speechDb, silenceDb, silenceMs, timeoutMs, thenKey}) => {
  const client = window.mediaserver.client;
  const t0 = performance.now();
  let heard = false;
  let quietSince = null;
  while (performance.now() - t0 < timeoutMs) {
    const level = client.micLevel();
    if (level === null) throw new Error("no microphone level: the page's AudioContext is not running");
    const now = performance.now();
    if (level > speechDb) {
      heard = true;
      quietSince = null;
    } else if (level < silenceDb) {
      if (quietSince === null) quietSince = now;
      if (heard && now - quietSince >= silenceMs) {
        // Press or release Space right here, with no round trip to the test in between.
        if (thenKey) document.dispatchEvent(new KeyboardEvent(thenKey, {code: "Space", key: " ", bubbles: true}));
        return now - t0;
      }
    } else {
      quietSince = null;
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  throw new Error("timed out waiting for speech followed by silence on the microphone");
}
"""

# An upper bound for what getStats() leaves out: STUN consent checks are not in the transport's
# bytesSent, and no counter includes IP/UDP headers (48 bytes on IPv6).
STUN_PACKET_BYTES = 120
IP_UDP_HEADER_BYTES = 48

_IDLE_BITRATE = """
async ({ms, stunBytes, headerBytes}) => {
  const client = window.mediaserver.client;
  const a = await client.sentBytes();
  await new Promise((resolve) => setTimeout(resolve, ms));
  const b = await client.sentBytes();
  const dt = b.timestamp - a.timestamp;
  if (b.total === null || a.total === null) return {seconds: dt / 1000, totalKbps: null};
  const stun = b.stunPackets - a.stunPackets;
  const packets = b.packets - a.packets;
  const wireBytes = b.total - a.total + stun * stunBytes + (packets + stun) * headerBytes;
  return {
    seconds: dt / 1000,
    totalBytes: b.total - a.total,
    packets,
    stunPackets: stun,
    audioBytes: b.audio - a.audio,
    totalKbps: ((b.total - a.total) * 8) / dt,
    audioKbps: ((b.audio - a.audio) * 8) / dt,
    wireKbpsUpperBound: (wireBytes * 8) / dt,
  };
}
"""


@dataclass
class Page:
    page: Any
    errors: list[str] = field(default_factory=list)

    async def state(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.page.evaluate("JSON.parse(JSON.stringify(window.mediaserver.state))")
        return result

    async def wait_for(self, js: str, timeout_s: float = 30.0) -> None:
        await self.page.wait_for_function(js, timeout=timeout_s * 1000)

    async def speech_then_silence(self, silence_ms: int, timeout_s: float, then_key: str | None = None) -> None:
        """Return once the microphone has carried speech and then ``silence_ms`` of silence; with
        ``then_key`` (``"keydown"``, ``"keyup"``), the page presses or releases Space at that moment."""
        await self.page.evaluate(
            _WAIT_SPEECH_THEN_SILENCE,
            {
                "speechDb": SPEECH_DB,
                "silenceDb": SILENCE_DB,
                "silenceMs": silence_ms,
                "timeoutMs": timeout_s * 1000,
                "thenKey": then_key,
            },
        )


@asynccontextmanager
async def open_page(browser: Browser, url: str) -> AsyncIterator[Page]:
    page = await browser.context.new_page()
    page.set_default_timeout(30_000)
    opened = Page(page)
    page.on("pageerror", lambda exc: opened.errors.append(f"page error: {exc}"))
    page.on("console", lambda msg: opened.errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    try:
        await page.goto(url, wait_until="load")
        await page.wait_for_function("window.mediaserver !== undefined", timeout=10_000)
        yield opened
    finally:
        await page.close()


async def connect(page: Page) -> None:
    await page.page.click("#connect")
    try:
        await page.wait_for("window.mediaserver.state.connected", timeout_s=30)
    except Exception:
        state = await page.state()
        pytest.fail(f"the page did not connect: errors {state['errors']}, connection {state['connection']}")


def first_text(transcript: list[dict[str, Any]], *, final: bool | None = None) -> dict[str, Any]:
    for entry in transcript:
        if entry["text"].strip() and (final is None or entry["final"] == final):
            return entry
    raise AssertionError(f"no transcript text in {transcript}")


async def test_push_to_talk_transcribes_the_sentence(
    server: LiveServer, browser: Browser, fake_microphone: FakeMicrophone, wer: Callable[[str, str], float]
) -> None:
    loop_s = fake_microphone.loop_s
    async with open_page(browser, f"{server.url}/rtc/") as page:
        await connect(page)
        # In the pause before a sentence: hold Space through the sentence, release in the next pause.
        await page.speech_then_silence(300, timeout_s=2 * loop_s + 2, then_key="keydown")
        await page.wait_for("window.mediaserver.state.recording", timeout_s=5)
        await page.speech_then_silence(700, timeout_s=loop_s + 2, then_key="keyup")
        await page.wait_for("window.mediaserver.state.transcript.length > 0", timeout_s=30)
        state = await page.state()
        entry = first_text(state["transcript"])
        error_rate = wer(fake_microphone.text, entry["text"])
        assert entry["latencyMs"] is not None and entry["latencyMs"] > 0, entry
        print(
            f"push-to-talk: {entry['text']!r} WER {error_rate:.2f}, {entry['latencyMs']:.0f} ms after release, "
            f"{state['partialCount']} partials"
        )
        assert error_rate <= MAX_WER, entry
        assert state["errors"] == [], state["errors"]
        assert state["bitrate"] is not None, "no getStats() bitrate sample after a recording"
        assert page.errors == []


async def test_idle_session_sends_almost_nothing(server: LiveServer, browser: Browser) -> None:
    async with open_page(browser, f"{server.url}/rtc/") as page:
        await connect(page)
        await page.page.wait_for_timeout(3000)  # let DTLS/SCTP set-up traffic pass
        measured: dict[str, Any] = await page.page.evaluate(
            _IDLE_BITRATE, {"ms": 6000, "stunBytes": STUN_PACKET_BYTES, "headerBytes": IP_UDP_HEADER_BYTES}
        )
        state = await page.state()
        assert state["connected"], state["connection"]
        kbps = measured["totalKbps"]
        assert kbps is not None, f"getStats() has no transport bytesSent: {measured}"
        print(f"idle send bitrate: {kbps:.2f} kbps")
        report = (
            f"idle send bitrate: {kbps:.2f} kbps (transport bytesSent: {measured['totalBytes']} bytes, "
            f"{measured['packets']} packets in {measured['seconds']:.1f} s; "
            f"audio RTP {measured['audioKbps']:.2f} kbps; "
            f"with {measured['stunPackets']} STUN consent packets and IP/UDP headers at most "
            f"{measured['wireKbpsUpperBound']:.2f} kbps on the wire)"
        )
        print(report)
        BENCH_DIR.mkdir(exist_ok=True)
        (BENCH_DIR / "idle_bitrate.txt").write_text(report + "\n")
        assert kbps <= MAX_IDLE_KBPS, measured
        assert measured["wireKbpsUpperBound"] <= MAX_IDLE_KBPS, measured
        assert measured["audioBytes"] == 0, f"audio RTP flowed while the track was paused: {measured}"
        assert page.errors == []


async def test_hands_free_infers_by_itself(
    server: LiveServer, browser: Browser, fake_microphone: FakeMicrophone, wer: Callable[[str, str], float]
) -> None:
    loop_s = fake_microphone.loop_s
    async with open_page(browser, f"{server.url}/rtc/") as page:
        await connect(page)
        await page.speech_then_silence(300, timeout_s=2 * loop_s + 2)
        await page.page.click("#hands-free")
        await page.wait_for("window.mediaserver.state.handsFree", timeout_s=5)
        # "server default" left as it is: the page says what the server runs (silence, without the assistant).
        await page.wait_for("window.mediaserver.state.turns", timeout_s=5)
        assert (await page.state())["turns"] == {"turnDetection": "silence", "eagerness": None, "fallback": None}
        assert "silence turns" in (await page.page.text_content("#vad") or "")
        await page.wait_for(
            "window.mediaserver.state.transcript.some((e) => e.final && e.text.trim())", timeout_s=loop_s + 20
        )
        state = await page.state()
        entry = first_text(state["transcript"], final=True)
        error_rate = wer(fake_microphone.text, entry["text"])
        latency = entry["latencyMs"]
        print(
            f"hands-free: {entry['text']!r} WER {error_rate:.2f}, "
            f"{'?' if latency is None else f'{latency:.0f}'} ms after speech_stopped, "
            f"{state['partialCount']} partials"
        )
        assert error_rate <= MAX_WER, state["transcript"]
        # The server's own time on it (its speech_stopped can come with the final: timed from that
        # here it said 0 ms, titled "from end of speech").
        assert entry["latencyFrom"] == "server" and latency is not None and latency > 0, entry
        assert state["errors"] == [], state["errors"]
        await page.page.click("#hands-free")  # stop
        await page.wait_for("!window.mediaserver.state.handsFree", timeout_s=5)
        assert page.errors == []


async def test_embed_page_connects(server: LiveServer, browser: Browser) -> None:
    async with open_page(browser, f"{server.url}/rtc/embed.html?theme=dark") as page:
        await page.wait_for("window.mediaserver.state.connected", timeout_s=30)
        assert await page.page.evaluate("document.documentElement.dataset.theme") == "dark"
        assert await page.page.is_enabled("#talk")
        state = await page.state()
        assert not state["recording"]
        assert page.errors == []
    async with open_page(browser, f"{server.url}/rtc/embed.html?hands_free=1") as page:
        await page.wait_for("window.mediaserver.state.connected && window.mediaserver.state.handsFree", timeout_s=30)
        assert (await page.state())["errors"] == []
        assert page.errors == []


# The sandbox of Home Assistant's Webpage (iframe) card, with and without allow-same-origin.
_SANDBOX = "allow-forms allow-popups allow-pointer-lock allow-scripts allow-modals allow-downloads"


@asynccontextmanager
async def dashboard_server(html: str) -> AsyncIterator[str]:
    """A page on another origin (http://localhost:<port>, a secure context) that frames the embed."""

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://localhost:{runner.addresses[0][1]}/"
    finally:
        await runner.cleanup()


async def test_embed_page_in_a_dashboard_iframe(server: LiveServer, browser: Browser) -> None:
    """As docs/home-assistant.md says: the frame needs allow="microphone" and a real origin."""
    embed = f"{server.url}/rtc/embed.html"
    frames = {
        "granted": f'sandbox="{_SANDBOX} allow-same-origin" allow="microphone"',
        "card-default": f'sandbox="{_SANDBOX} allow-same-origin" allow="fullscreen"',
        "opaque": f'sandbox="{_SANDBOX}" allow="microphone"',
    }
    html = '<!doctype html><link rel="icon" href="data:,">' + "".join(
        f'<iframe id="{name}" src="{embed}" {attrs}></iframe>' for name, attrs in frames.items()
    )
    async with dashboard_server(html) as url:
        page = await browser.context.new_page()
        try:
            await page.goto(url)

            async def frame(name: str) -> Any:
                element = await page.wait_for_selector(f"#{name}", state="attached")
                return await element.content_frame()

            granted = await frame("granted")
            await granted.wait_for_function("window.mediaserver && window.mediaserver.state.connected", timeout=30_000)
            status = "document.getElementById('status-text').textContent"
            card_default = await frame("card-default")
            await card_default.wait_for_function(f"{status}.includes('allow: microphone')", timeout=10_000)
            opaque = await frame("opaque")
            await opaque.wait_for_function(f"{status}.includes('disable_sandbox')", timeout=10_000)
        finally:
            await page.close()


async def test_page_is_served_without_trailing_slash(server: LiveServer, browser: Browser) -> None:
    async with open_page(browser, f"{server.url}/rtc") as page:
        assert (await page.page.evaluate("location.pathname")).endswith("/rtc/")
        await page.wait_for("document.querySelector('#model').options.length > 1", timeout_s=10)
        # Only the speech recognition models: /v1/models also lists the LLMs and embedding models,
        # which a stream cannot use (picking one made Connect fail with a 400).
        offered = await page.page.evaluate("[...document.querySelector('#model').options].map((o) => o.value)")
        assert "tiny.en" in offered and "whisper-1" in offered, offered
        assert not {"gpt-4o", "text-embedding-3-small", "smollm2-135m-instruct"} & set(offered), offered
        assert page.errors == []


@pytest.mark.parametrize(
    ("query", "refusal"),
    [("model=nosuchmodel", "unknown model 'nosuchmodel'"), ("beam_size=abc", "beam_size")],
)
async def test_autoconnect_with_a_bad_parameter_is_refused_at_connect(
    server: LiveServer, browser: Browser, query: str, refusal: str
) -> None:
    """/rtc/?autoconnect=1 with a bad ?model= or ?beam_size= is refused when it connects, by name (a
    user trial: the page connected without them, then every utterance failed on the model, and the
    beam was silently dropped while the menu still showed it)."""
    async with open_page(browser, f"{server.url}/rtc/?autoconnect=1&{query}") as page:
        await page.wait_for("window.mediaserver.state.errors.length > 0", timeout_s=30)
        errors: list[str] = await page.page.evaluate("window.mediaserver.state.errors")
        assert any("refused" in e and refusal in e for e in errors), errors
        assert not await page.page.evaluate("window.mediaserver.state.connected")


async def test_speak_panel_plays_speech(server: LiveServer, browser: Browser) -> None:
    """The "Speak" panel: text in, the server's voice out through WebAudio, first sentence first."""
    async with open_page(browser, f"{server.url}/rtc/") as page:
        await page.wait_for("window.mediaserverSpeak && window.mediaserverSpeak.voices.length > 0", timeout_s=15)
        assert await page.page.input_value("#speak-voice") == "en_US-joe-medium"
        await page.page.fill("#speak-text", "Hello from the speak panel. This is its second sentence. And a third.")
        await page.page.click("#speak-play")
        await page.wait_for("window.mediaserverSpeak.firstAudioMs !== null", timeout_s=60)
        await page.wait_for("!window.mediaserverSpeak.speaking", timeout_s=60)
        speak: dict[str, Any] = await page.page.evaluate("JSON.parse(JSON.stringify(window.mediaserverSpeak))")
        print(f"speak panel: first audio after {speak['firstAudioMs']:.0f} ms, {speak['seconds']:.1f} s of speech")
        assert speak["error"] is None, speak
        assert speak["requests"] == 1 and speak["seconds"] > 3.0, speak
        # What left the page's audio graph was speech, not silence.
        assert speak["peakDb"] is not None and speak["peakDb"] > -40, speak
        assert "first audio after" in await page.page.text_content("#speak-status")
        assert page.errors == []


async def test_assistant_mode_answers_aloud(
    server_factory: Callable[..., Any], browser: Browser, fake_microphone: FakeMicrophone
) -> None:
    """Assistant mode: the fake microphone's sentence is answered; the answer is shown as it is
    written and its audio arrives on the server's track, which the page plays in an <audio>."""
    server: LiveServer = await server_factory(assistant_temperature=0.0, assistant_max_answer_tokens=40)
    async with open_page(browser, f"{server.url}/rtc/") as page:
        await connect(page)
        await page.wait_for("window.mediaserver.state.assistantTrack", timeout_s=10)
        await page.page.click("#assistant")
        await page.wait_for("window.mediaserver.state.assistant", timeout_s=5)
        # With the assistant, the server's default turns are semantic: the page shows them in force.
        await page.wait_for("window.mediaserver.state.turns", timeout_s=5)
        turns = (await page.state())["turns"]
        assert turns["turnDetection"] == "semantic" and turns["eagerness"] == "auto", turns
        await page.wait_for(
            "window.mediaserver.state.answer.trim() || window.mediaserver.state.answers.length > 0",
            timeout_s=fake_microphone.loop_s + 60,
        )
        await page.wait_for("window.mediaserver.state.audioPlaying", timeout_s=60)
        await page.wait_for("window.mediaserver.state.answers.length > 0", timeout_s=60)
        state = await page.state()
        first = state["answers"][0]
        print(f"assistant: heard {state['transcript'][:1]}, answered {first}")
        assert first["text"].strip() or first["heard"].strip(), state["answers"]
        assert await page.page.evaluate("document.getElementById('assistant-audio').srcObject !== null")
        assert state["errors"] == [], state["errors"]
        await page.page.click("#assistant")  # off again
        await page.wait_for("!window.mediaserver.state.assistant", timeout_s=5)
        assert page.errors == []


async def test_disconnecting_mid_answer_ends_the_answer_on_the_page(
    server_factory: Callable[..., Any], browser: Browser, fake_microphone: FakeMicrophone
) -> None:
    """Disconnect while an answer plays: the answer joins the list as cut and the Interrupt button
    goes off (they stayed on the old answer, through the next Connect too)."""
    server: LiveServer = await server_factory(assistant_temperature=0.0, assistant_max_answer_tokens=40)
    async with open_page(browser, f"{server.url}/rtc/") as page:
        await connect(page)
        await page.wait_for("window.mediaserver.state.assistantTrack", timeout_s=10)
        await page.page.click("#assistant")
        await page.wait_for("window.mediaserver.state.assistantSpeaking", timeout_s=fake_microphone.loop_s + 60)
        await page.page.click("#disconnect")
        await page.wait_for("!window.mediaserver.state.connected", timeout_s=5)
        state = await page.state()
        assert not state["assistantSpeaking"] and state["answer"] == "", state
        assert state["answers"] and state["answers"][-1]["interrupted"], state["answers"]
        assert await page.page.is_disabled("#interrupt")
        assert page.errors == []


async def test_wake_word_option_shows_what_it_listens_for(
    server: LiveServer, browser: Browser, fake_microphone: FakeMicrophone
) -> None:
    """Hands-free with the wake word: the page says what it waits for, and the fake microphone's
    sentence (no wake word in it) is not transcribed."""
    async with open_page(browser, f"{server.url}/rtc/") as page:
        await connect(page)
        await page.page.check("#wake")
        await page.page.check("#noise")
        await page.page.click("#hands-free")
        await page.wait_for("window.mediaserver.state.handsFree", timeout_s=5)
        await page.wait_for("document.getElementById('vad').textContent.includes('okay nabu')", timeout_s=10)
        assert await page.page.text_content("#vad") == "listening for 'okay nabu'"
        BENCH_DIR.mkdir(exist_ok=True)
        await page.page.screenshot(path=str(BENCH_DIR / "rtc-wake.png"))
        # The fake microphone says its sentence (and pauses) at least once: nothing is transcribed.
        await page.speech_then_silence(1500, timeout_s=2 * fake_microphone.loop_s + 2)
        state = await page.state()
        assert state["wake"] == {"awake": False, "text": "listening for 'okay nabu'", "heard": 0}
        await page.page.click("#hands-free")  # stop
        await page.wait_for("!window.mediaserver.state.handsFree", timeout_s=5)
        assert [e for e in state["transcript"] if e["text"].strip()] == []
        assert page.errors == []
