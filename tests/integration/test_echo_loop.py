"""A device without echo cancellation, over a real voice loop (the device WebSocket, the bundled
LLM and Piper): the test client plays the answer audio it receives through a simulated room and
feeds that echo back into its microphone stream, 150 ms late, in real time.

Without the server's echo cancellation (``echo_cancellation`` off) the echo interrupts the answer.
On the defaults (``auto``: the canceller's output where the microphone carries the echo), the
answer plays to its end and the next question is answered; a device that does not hear itself is
heard and answered as before, and a person barging in over the echo still cuts the answer and is
answered (here with the barge-in word check, stream/echo_check.py, on). What AEC3 lets through
while it converges, and the speech gate against it, are measured in docs/echo.md
(tools/echo_leaks.py; the gate's own test: tests/unit/test_stream_session.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import numpy as np
import pytest

from mediaserver.stream.echo_check import words
from tests.conftest import Clip, LiveServer
from tests.echo_room import room_ir
from tests.human_speech import default_dir, load_clips, voiced_span

RATE = 16000
TICK = RATE // 50  # 20 ms of microphone audio per frame
DELAY_S = 0.15  # loudspeaker to microphone, device buffers included
GAIN = 0.7  # the echo's level against the answer as sent
VOICE_SETTINGS: dict[str, Any] = {
    "assistant_temperature": 0.0,
    "assistant_max_answer_tokens": 40,
    "assistant_system_prompt": "You are a helpful voice assistant. Answer in one or two short sentences.",
}


class EchoingDevice:
    """A device socket whose microphone hears the device's own loudspeaker (and the user)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, gain: float = GAIN) -> None:
        self.ws = ws
        self.gain = gain
        self.messages: list[dict[str, Any]] = []
        self.message_at: list[float] = []  # when each message arrived (monotonic)
        self.arrived = asyncio.Event()
        self._speaker: list[np.ndarray] = []  # answer audio received, waiting to be played
        self._played = np.zeros(int(DELAY_S * RATE) + 4000, np.float32)  # what the loudspeaker played
        self._ir = room_ir(np.random.default_rng(7), rt60_s=0.2)
        self._user = np.zeros(0, np.float32)  # what the user says next
        self.frames_at: list[float] = []  # when each answer frame arrived (monotonic)
        self.played_samples = 0  # answer audio the loudspeaker has played
        self.mic_samples = 0  # microphone audio sent
        self.said_at: float | None = None  # when the microphone began sending the latest say()
        self.said_sample = 0  # where in the microphone stream it began (the stream's clock, never muted)
        self.mute_while_playing = False  # a half-duplex device: sends nothing while its loudspeaker plays

    async def read(self) -> None:
        async for msg in self.ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                self.frames_at.append(time.monotonic())
                self._speaker.append(np.frombuffer(msg.data, "<i2").astype(np.float32) / 32768.0)
            elif msg.type == aiohttp.WSMsgType.TEXT:
                self.message_at.append(time.monotonic())
                self.messages.append(json.loads(msg.data))
                self.arrived.set()

    def say(self, audio16k: np.ndarray) -> None:
        self._user = np.concatenate([self._user, audio16k.astype(np.float32)])
        self.said_at = None

    @property
    def saying(self) -> bool:
        """What the user says is still going out on the microphone."""
        return self._user.size > 0

    @property
    def speaker_idle(self) -> bool:
        """The loudspeaker has played everything received, and its echo has died away."""
        return not self._speaker and not np.any(self._played[-int(DELAY_S * RATE) - self._ir.size :])

    def _play(self) -> np.ndarray:
        """The next 20 ms from the loudspeaker (silence when no answer audio waits)."""
        queued = np.concatenate(self._speaker) if self._speaker else np.zeros(0, np.float32)
        now, rest = queued[:TICK], queued[TICK:]
        self._speaker = [rest] if rest.size else []
        self.played_samples += now.size
        return np.pad(now, (0, TICK - now.size))

    def _microphone(self) -> np.ndarray:
        self._played = np.concatenate([self._played[TICK:], self._play()])
        delay = int(DELAY_S * RATE)
        source = self._played[-(delay + TICK + self._ir.size) : -delay]
        echo = np.convolve(source, self._ir)[self._ir.size : self._ir.size + TICK] * self.gain
        user, self._user = self._user[:TICK], self._user[TICK:]
        if user.size and self.said_at is None:
            self.said_at = time.monotonic()
            self.said_sample = self.mic_samples
        self.mic_samples += TICK
        mic: np.ndarray = np.tanh(echo * 1.5) / 1.5 + np.pad(user, (0, TICK - user.size))  # a small loudspeaker clips
        return mic

    async def run_microphone(self, stop: asyncio.Event) -> None:
        started = time.monotonic()
        n = 0
        while not stop.is_set():
            pcm = (np.clip(self._microphone(), -1, 1) * 32767).astype("<i2").tobytes()
            if not (self.mute_while_playing and not self.speaker_idle):
                await self.ws.send_bytes(pcm)
            n += 1
            await asyncio.sleep(max(0.0, started + n * TICK / RATE - time.monotonic()))

    @property
    def settled(self) -> bool:
        """Every utterance the server heard has ended and (unless discarded) has its final."""
        stopped = [m for m in self.messages if m["type"] == "speech_stopped"]
        started: int = sum(m["type"] == "speech_started" for m in self.messages)
        finals: int = sum(m["type"] == "final" for m in self.messages)
        heard: int = sum(not m["discarded"] for m in stopped)
        return started == len(stopped) and finals >= heard

    async def until(self, kind: str, after: int, timeout_s: float = 90.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            while True:
                found = [m for m in self.messages[after:] if m["type"] in (kind, "error")]
                if found:
                    return found[0]
                self.arrived.clear()
                await self.arrived.wait()

    async def condition(self, check: Callable[[], bool], timeout_s: float = 90.0) -> None:
        """Wait until ``check()`` holds (looked at every microphone frame)."""
        async with asyncio.timeout(timeout_s):
            while not check():
                await asyncio.sleep(TICK / RATE)


@contextlib.asynccontextmanager
async def echoing_device(
    server: LiveServer, *, echo_cancellation: str | None = None, gain: float = GAIN
) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, EchoingDevice]]:
    """A device socket to ``server``'s voice loop, started with ``echo_cancellation`` (None: not
    sent, the server's default), its microphone streaming in real time until the block ends."""
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{server.url}/api/ws/asr") as ws:
        device = EchoingDevice(ws, gain=gain)
        reader = asyncio.create_task(device.read())
        start: dict[str, Any] = {"type": "start", "mode": "server_vad", "assistant": True}
        if echo_cancellation is not None:
            start["echo_cancellation"] = echo_cancellation
        await ws.send_str(json.dumps(start))
        ready = await device.until("ready", 0)
        assert ready["echo_cancellation"] is (echo_cancellation != "off"), ready
        microphone = asyncio.create_task(device.run_microphone(stop))
        try:
            yield ws, device
        finally:
            stop.set()
            await microphone
            reader.cancel()


async def test_without_echo_cancellation_the_answer_interrupts_itself(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """What docs/ws-protocol.md warns a device without echo cancellation about (the stream's
    ``echo_cancellation`` off): the answer's echo is heard as the user barging in."""
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    async with echoing_device(server, echo_cancellation="off") as (_, device):
        device.say(speech("What do cows eat?").audio16k)
        stopped = await device.until("assistant_audio_stopped", 0)
        assert stopped.get("interrupted") is True, stopped


async def test_with_echo_cancellation_on_a_quiet_device_is_heard_and_answered(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """The canceller in the path (``echo_cancellation`` auto, the default) changes nothing for a device that does not
    hear itself: the question is transcribed, the answer plays to its end, the next one is answered;
    and when the device stops sending its microphone while it plays (half-duplex), the answer's
    reference is not held against the next question (the canceller's clock moves on through the
    gap): it is heard whole and answered."""
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    headset = 0.0  # its loudspeaker never reaches the microphone
    before = await echo_auto_decisions(server)
    async with echoing_device(server, gain=headset) as (_, device):
        questions = (("What do cows eat?", "cows"), ("What do bees make?", "bees"))
        for n, (question, word) in enumerate(questions):
            device.mute_while_playing = n == 0  # during the first answer
            await device.condition(lambda: device.speaker_idle)
            mark = len(device.messages)
            device.say(speech(question).audio16k)
            stopped = await device.until("assistant_audio_stopped", mark)
            finals = [m["text"] for m in device.messages[mark:] if m["type"] == "final"]
            assert stopped["interrupted"] is False and len(finals) == 1, (stopped, finals)
            assert word in finals[0].lower(), finals
    # auto found no echo on this microphone (it passed uncancelled), never an echo
    after = await echo_auto_decisions(server)
    assert after["none"] > before["none"] and after["echo"] == before["echo"], (before, after)


async def test_on_the_defaults_the_answer_plays_to_its_end_and_the_next_question_is_answered(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """Issue #37's promise, on the server's defaults and a start that says nothing of echo: the device
    hears its whole answer back 150 ms late at 0.7 (without the canceller the answer cuts itself
    within a second, every run: the first test here), yet each question is heard, the answer plays
    to its end and the next question is answered; auto found this microphone's echo (/metrics).
    What AEC3 still lets through now and then, a leak at an answer's first syllable that cuts it
    ("Bees": before each answer's first frame waited for the microphone's, the runs whose two answers
    the device played a frame apart, 8 of 14 one afternoon; 0 of 23 since: docs/echo.md, "Answers a
    frame apart"), is reported as an expected failure once the rest has held."""
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    cut: list[tuple[int, str]] = []
    before = await echo_auto_decisions(server)
    async with echoing_device(server) as (ws, device):
        for n, (question, word) in enumerate((("What do cows eat?", "cows"), ("What do bees make?", "bees"))):
            await device.condition(lambda: device.speaker_idle and device.settled)
            mark = len(device.messages)
            device.say(speech(question).audio16k)
            started = await device.until("assistant_audio_started", mark)
            finals = user_finals(device.messages[mark : mark + device.messages[mark:].index(started)])
            assert len(finals) == 1 and word in finals[0].lower(), (n, finals)
            stopped = await device.until("assistant_audio_stopped", mark)
            if stopped["interrupted"]:
                cut.append((n, stopped["heard"]))
                # whatever the leak started (its final, maybe an answer) ends before the next question
                await device.condition(lambda: device.speaker_idle and device.settled)
                await ws.send_str(json.dumps({"type": "interrupt"}))
                await ws.send_str(json.dumps({"type": "ping"}))
                await device.until("pong", mark)
    after = await echo_auto_decisions(server)  # (the counters are the worker's: other tests' streams count too)
    assert after["echo"] == before["echo"] + 1 and after["none"] == before["none"], (before, after)
    if cut:
        pytest.xfail(f"an echo leak cut the answer: {cut}")


async def echo_auto_decisions(server: LiveServer) -> dict[str, float]:
    """/metrics' ``mediaserver_echo_auto_decisions``, by ``found`` (echo, none)."""
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as resp:
        text = await resp.text()
    found = {}
    for kind in ("echo", "none"):
        line = f'mediaserver_echo_auto_decisions_total{{found="{kind}"}} '
        found[kind] = sum(float(row[len(line) :]) for row in text.splitlines() if row.startswith(line))
    return found


def user_final_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The finals taken as the user's: with words (an empty one is not answered), not the answer's
    echo (marked ``echo``, not answered either)."""
    return [m for m in messages if m["type"] == "final" and m["text"].strip() and not m.get("echo")]


def user_finals(messages: list[dict[str, Any]]) -> list[str]:
    """The texts of ``user_final_messages``."""
    return [m["text"] for m in user_final_messages(messages)]


@pytest.mark.parametrize(
    ("word_check", "duck_db"), [(False, None), (True, None), (False, 0.0)], ids=["defaults", "word_check", "pause"]
)
async def test_a_person_barging_in_over_the_echo_still_cuts_the_answer_and_is_answered(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip], word_check: bool, duck_db: float | None
) -> None:
    """A person (a real recording) speaking over the echoing answer stops its audio within 0.5 s of
    their first voiced frame, and what they said is the next turn, answered. On the defaults their
    start cuts the answer at once (or, taken for a suspect start, plays it
    assistant_barge_in_echo_duck_db quieter until the start is long enough to pause it, and then
    their words decide); at ``pause`` (that setting 0) a suspect start pauses it at once; with the
    word check every start pauses it, as fast as a cut, and their words, not the answer's, interrupt
    it. (Without the speech gate over the whole echo: with it at a 12 dB removed
    limit, this person, 8 dB under the echo's peaks at the microphone, was not heard at all in 4 of 6
    runs; docs/echo.md.)"""
    [(_, person, reference)] = load_clips(default_dir(), ["goforward"])
    voiced_from, voiced_to = voiced_span(person)
    onset_s = voiced_from / RATE
    said = {*words(reference), "10"}  # "go forward ten meters"; Whisper writes "10"
    ducking = {} if duck_db is None else {"assistant_barge_in_echo_duck_db": duck_db}
    server: LiveServer = await server_factory(**VOICE_SETTINGS, **ducking, assistant_barge_in_echo_check=word_check)
    async with echoing_device(server) as (ws, device):
        # A first answer, however it goes, converges the canceller (its first second may leak, cut it
        # and be answered: such an answer is stopped before the person's turn).
        device.say(speech("What do cows eat?").audio16k)
        await device.until("assistant_audio_stopped", 0)
        await device.condition(lambda: device.speaker_idle and device.settled)
        await ws.send_str(json.dumps({"type": "interrupt"}))
        await ws.send_str(json.dumps({"type": "ping"}))  # answered once the interrupt has been read
        await device.until("pong", 0)
        await device.condition(lambda: device.speaker_idle and device.settled)
        first = len(device.messages)
        device.say(speech("Tell me about cows.").audio16k)
        await device.until("assistant_audio_started", first)
        played = device.played_samples
        await device.condition(lambda: device.played_samples >= played + 2 * RATE)  # 2 s of it played
        mark = len(device.messages)
        device.say(person)
        stopped = await device.until("assistant_audio_stopped", mark)
        at = device.messages.index(stopped)
        assert device.said_at is not None
        spoke_at = device.said_at + onset_s
        said_from_ms = (device.said_sample + voiced_from) * 1000 / RATE  # where they spoke on the stream's clock
        said_to_ms = (device.said_sample + voiced_to) * 1000 / RATE
        ended_before = [m for m in device.messages[first:mark] if m["type"] == "assistant_audio_stopped"]
        if ended_before or (not stopped["interrupted"] and device.message_at[at] < spoke_at):
            # The answer (SmolLM2's, its length varies with the first turn's history) was over, or cut
            # by a leak, before the person spoke: there was nothing to barge in on.
            pytest.xfail(f"the answer ended before the person spoke: {(ended_before or [stopped])[0]}")
        assert stopped["interrupted"] is True, (
            stopped,
            round(device.message_at[at] - spoke_at, 2),
            (said_from_ms, said_to_ms),  # against the messages' audio_*_ms
            device.messages[mark:],
        )
        # The answer pauses (or is cut) at the speech start of the person's utterance (the last one
        # up to the stop: an echo leak just before may have started it, and the person joined it; a
        # start that cuts the answer at once sends the stop just before its speech_started): no
        # answer frame arrives after it until the stop. Counted in frames, not seconds: a loaded
        # machine delays both ends of this socket alike.
        await device.until("speech_started", mark)
        started_at = max(
            t
            for m, t in zip(device.messages[: at + 2], device.message_at[: at + 2], strict=True)
            if m["type"] == "speech_started"
        )
        after = [t for t in device.frames_at if started_at < t < device.message_at[at]]
        assert not after, f"{len(after)} answer frames came after the speech start, before the stop"
        # How soon the VAD heard the person: 0.3 s on a clean line (test_voice_loop.py). Under the
        # canceller, AEC3's suppressor removes the person's first syllables entirely wherever the
        # answer's echo is louder than they are ("go" at -25 dBFS under echo at -17 dBFS came out at
        # -65..-83 dBFS; docs/echo.md), so the VAD hears them 0.40-0.43 s late in half the runs here,
        # 0.83 s once in CI. Checked below, once the rest of the barge-in has held.
        heard_after_s = started_at - spoke_at
        # What the person said is the next turn, or turns (the turn model may end "Go forward." at
        # their pause), garbled by double talk, not lost ...
        # (Finals come in order: once the one holding their last words is in, so are those before.)
        await device.condition(
            lambda: (
                any(m["type"] == "final" and m["audio_end_ms"] >= said_to_ms for m in device.messages[mark:])
                or (not device.saying and device.settled and device.speaker_idle)
            )
        )
        # (the user finals of utterances begun before the person stopped speaking)
        finals = [m for m in user_final_messages(device.messages[mark:]) if m["audio_start_ms"] < said_to_ms]
        # Their utterance is not lost: a user's final holds at least 300 ms of their speech (its
        # words are checked below, once the rest has held: under double talk AEC3 may have taken them
        # all but a garbled last one, "Peter.", "centimeters.", in 1 of 5 runs beside two CPU-bound
        # processes).
        assert finals and finals[-1]["audio_end_ms"] >= said_from_ms + 300, finals
        heard = said & {w for m in finals for w in words(m["text"])}
        # (the whole of it: the double talk garbles its start, "over 10 meters.", but no part of it
        # was taken for the answer's echo; shorter only where the double talk took its first words,
        # "and meters.", "10 meters.", reported below)
        spoken_ms = said_to_ms - said_from_ms
        whole = finals[-1]["audio_end_ms"] - finals[0]["audio_start_ms"] >= spoken_ms - 100
        # Shorter only at its start, where the segmenter never heard the first words (its pre-roll
        # reaches back before the onset it hears): its audio begins after the person's onset.
        late_ms = finals[0]["audio_start_ms"] - said_from_ms
        assert whole or late_ms > 100, (finals, spoken_ms, late_ms, round(heard_after_s, 2))
        # ... and is answered.
        answer = await device.until("assistant_audio_stopped", at + 1)
        print(
            f"{reference!r} heard as {[m['text'] for m in finals]} from {late_ms:.0f} ms after its onset, its start "
            f"told {heard_after_s:.2f} s after it; "
            f"the cut answer's heard {stopped['heard']!r}; next {answer}"
        )
        assert answer["type"] == "assistant_audio_stopped", answer
        if heard_after_s > 0.5:
            pytest.xfail(
                f"the VAD heard the person {heard_after_s:.2f} s after they spoke (over 0.5 s): "
                "their first syllables were suppressed under double talk (issue #37's target: 0.3 s)"
            )
        if not whole or len(heard) < 2:
            # The words said under double talk, before the answer stopped, are AEC3's to keep: its
            # suppressor keeps 0.51 of the near end on average, 0.14 at worst (docs/echo.md), and in about
            # one run of four here the segmenter heard the person only from "ten" ("and meters.",
            # "10 meters."), now and then not even that ("Peter."). Reported, not hidden.
            lost = "first words" if heard else "words"
            pytest.xfail(
                f"the person's {lost} were lost under double talk: heard {[m['text'] for m in finals]} "
                f"from {late_ms:.0f} ms in"
            )
