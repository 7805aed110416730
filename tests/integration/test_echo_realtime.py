"""A Realtime WebSocket client without echo cancellation, over a real conversation (the bundled LLM
and Piper): the test client plays the ``response.output_audio.delta`` audio it receives (24 kHz)
through the simulated room of test_echo_loop.py and feeds that echo back into the audio it appends
(16 kHz, this server's extension), 150 ms late, in real time, as a laptop or a Raspberry Pi running
an OpenAI SDK app on its loudspeaker would.

Without the server's canceller (``session.audio.input.echo_cancellation`` off) server
VAD hears the answer's echo as the user: ``input_audio_buffer.speech_started`` cancels the response
(``interrupt_response``), as OpenAI's protocol says. On the default (``auto``: the canceller's output
where the appended audio carries the echo), once the canceller has heard one
answer the next plays to its end with no speech start, and a person (a real recording) speaking
over it still cuts it; the client's ``conversation.item.truncate`` ends the reference where it
stopped playing. The first answer's first second may leak while AEC3 converges (docs/echo.md), so
the first answer here neither creates nor interrupts responses.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import av
import numpy as np
import pytest

from mediaserver.stream.echo_check import words
from tests.conftest import Clip, LiveServer
from tests.human_speech import default_dir, load_clips, voiced_span
from tests.integration.test_echo_loop import RATE, TICK, VOICE_SETTINGS, EchoingDevice

ANSWER_RATE = 24000  # the default output format, what SDK clients get
SPEECH_STARTED = "input_audio_buffer.speech_started"
SETTLED = (
    SPEECH_STARTED,
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.input_audio_transcription.failed",
)


class RealtimeDevice(EchoingDevice):
    """``EchoingDevice`` speaking OpenAI Realtime: appends out, deltas played through the room."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        super().__init__(ws)
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        self.item_id: str | None = None  # the answer item being played
        self.item_from = 0  # played_samples when it began to play
        self.truncate_on_speech = False  # stop playing and truncate at a speech start, as clients do

    async def read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            event = json.loads(msg.data)
            if event["type"] == "response.output_audio.delta":
                self._play_delta(event)
                continue
            self.message_at.append(time.monotonic())
            self.messages.append(event)
            self.arrived.set()
            if event["type"] == SPEECH_STARTED and self.truncate_on_speech and self._speaker and self.item_id:
                self._speaker = []  # the client stops playing the answer ...
                played_ms = (self.played_samples - self.item_from) * 1000 // RATE
                await self.send(
                    {
                        "type": "conversation.item.truncate",
                        "item_id": self.item_id,
                        "content_index": 0,
                        "audio_end_ms": played_ms,
                    }
                )  # ... and says how much it played

    def _play_delta(self, event: dict[str, Any]) -> None:
        if event["item_id"] != self.item_id:
            self.item_id, self.item_from = event["item_id"], self.played_samples + sum(s.size for s in self._speaker)
        pcm = np.frombuffer(base64.b64decode(event["delta"]), "<i2").astype(np.float32) / 32768.0
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = ANSWER_RATE
        for out in self._resampler.resample(frame):
            self._speaker.append(out.to_ndarray().reshape(-1).copy())
        self.frames_at.append(time.monotonic())

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(event))

    async def run_microphone(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        n = 0
        while not stop.is_set():
            pcm = (np.clip(self._microphone(), -1, 1) * 32767).astype("<i2").tobytes()
            await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode("ascii")})
            n += 1
            await asyncio.sleep(max(0.0, started + n * TICK / RATE - loop.time()))

    @property
    def settled(self) -> bool:
        """Every utterance server VAD heard has ended and has its transcript (or its failure)."""
        count: dict[str, int] = {kind: sum(m["type"] == kind for m in self.messages) for kind in SETTLED}
        started, stopped, committed, completed, failed = (count[kind] for kind in SETTLED)
        return started == stopped and completed + failed >= committed

    @property
    def said_done(self) -> bool:
        """Everything ``say`` was given has gone out (``settled`` then waits for its transcript)."""
        return not self._user.size

    async def settled_past(self, from_ms: int, mark: int) -> None:
        """Until everything said has gone out, every utterance has its transcript, and server VAD has
        closed one (since message ``mark``) past ``from_ms`` of input audio: a leak's (often empty)
        may come before the person's, and that alone is not enough."""
        await self.condition(
            lambda: (
                self.said_done
                and self.settled
                and any(
                    m["type"] == "input_audio_buffer.speech_stopped" and m["audio_end_ms"] > from_ms
                    for m in self.messages[mark:]
                )
            )
        )

    def heard_since(self, mark: int) -> list[str]:
        return [
            m["transcript"]
            for m in self.messages[mark:]
            if m["type"] == "conversation.item.input_audio_transcription.completed"
        ]


@contextlib.asynccontextmanager
async def realtime_device(
    server: LiveServer, echo_cancellation: str, turn_detection: dict[str, Any]
) -> AsyncIterator[RealtimeDevice]:
    """A Realtime conversation with ``server``, 16 kHz appends, its microphone streaming in real time."""
    stop = asyncio.Event()
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{server.url}/v1/realtime?model=gpt-realtime", max_msg_size=0) as ws,
    ):
        device = RealtimeDevice(ws)
        reader = asyncio.create_task(device.read())
        created = await device.until("session.created", 0)
        assert created["session"]["audio"]["input"]["echo_cancellation"] == "auto", created  # the default
        audio_input = {
            "format": {"type": "audio/pcm", "rate": RATE},
            "turn_detection": turn_detection,
            "echo_cancellation": echo_cancellation,
        }
        await device.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": audio_input}}})
        updated = await device.until("session.updated", 0)
        assert updated["type"] == "session.updated", updated
        assert updated["session"]["audio"]["input"]["echo_cancellation"] == echo_cancellation, updated
        microphone = asyncio.create_task(device.run_microphone(stop))
        try:
            yield device
        finally:
            stop.set()
            await microphone
            reader.cancel()


async def test_without_echo_cancellation_the_answer_cancels_itself(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """What a Realtime client on a loudspeaker gets today: its own answer's echo starts a turn and
    server VAD cancels the response (``turn_detected``)."""
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    async with realtime_device(server, "off", {"type": "server_vad"}) as device:
        device.say(speech("What do cows eat?").audio16k)
        created = await device.until("response.created", 0)
        start = device.messages.index(created)
        await device.until(SPEECH_STARTED, start + 1)
        done = await device.until("response.done", start + 1)
        assert done["response"]["status"] == "cancelled", done["response"]["status_details"]
        assert done["response"]["status_details"]["reason"] == "turn_detected", done


def content_words(text: str) -> set[str]:
    return {w for w in words(text) if len(w) >= 4}


async def test_with_echo_cancellation_no_word_of_the_answer_is_heard_and_a_person_still_cuts_the_next(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """With the canceller on the default (``auto``), an answer plays while server VAD listens
    (creating and interrupting no response): none of its words reaches an input transcript
    (without the canceller they would: webrtcvad hears 99.5 % of the echo, docs/echo.md). What
    AEC3 lets through while it converges can still start a turn, on which Whisper writes a stock
    phrase or nothing. Then, with
    ``interrupt_response`` on, a person (a real recording) speaking over the next answer cuts it and
    is heard, and the client's truncate is taken; an echo leak that cut it before they spoke, and
    their words taken by the canceller under double talk (their utterance heard, none of its words),
    are reported as expected failures."""
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    listening = {"type": "server_vad", "create_response": False, "interrupt_response": False}
    async with realtime_device(server, "auto", listening) as device:
        device.say(speech("What do cows eat?").audio16k)
        heard = await device.until("conversation.item.input_audio_transcription.completed", 0)
        assert "cows" in heard["transcript"].lower(), heard
        await device.send({"type": "response.create"})
        done = await device.until("response.done", 0)
        answer = done["response"]["output"][0]["content"][0]["transcript"]
        await device.condition(lambda: device.speaker_idle and device.settled)
        said = content_words(answer) - content_words("What do cows eat?")
        heard_all = device.heard_since(0)
        assert len(said) >= 3 and len(heard_all) >= 1, (answer, heard_all)
        echoed = said & content_words(" ".join(heard_all[1:]))
        assert not echoed, f"the answer's words {echoed} reached a transcript: {heard_all} (answer {answer!r})"

        # A person speaking over the next answer cuts it, and is heard.
        [(_, person, reference)] = load_clips(default_dir(), ["goforward"])
        interrupting = {**listening, "interrupt_response": True}
        update = {"type": "realtime", "audio": {"input": {"turn_detection": interrupting}}}
        await device.send({"type": "session.update", "session": update})
        device.truncate_on_speech = True
        mark = len(device.messages)
        device.say(speech("Tell me about bees.").audio16k)
        await device.until("conversation.item.input_audio_transcription.completed", mark)
        await device.send({"type": "response.create"})
        await device.until("response.created", mark)
        played = device.played_samples
        await device.condition(  # 1 s of it played, or it ended before
            lambda: (
                device.played_samples >= played + RATE
                or any(m["type"] == "response.done" for m in device.messages[mark:])
            )
        )
        cut = len(device.messages)
        person_from_ms = device.mic_samples * 1000 // RATE  # input audio time: they speak from here on
        device.say(person)
        done = await device.until("response.done", mark)
        assert done["response"]["status_details"]["reason"] == "turn_detected", done
        truncated = await device.until("conversation.item.truncated", mark)
        assert truncated["type"] == "conversation.item.truncated", truncated
        await device.settled_past(person_from_ms, cut)
        words_said = {*words(reference), "10"}  # "go forward ten meters"; Whisper writes "10"
        vad = [
            (m["type"], m.get("audio_start_ms", m.get("audio_end_ms")))
            for m in device.messages[cut:]
            if m["type"] in SETTLED[:2]
        ]
        # Their utterance is not lost: server VAD started one while they spoke, and that item's own
        # transcript has words (not a leak's utterance begun before them, nor another item's text).
        person_to_ms = person_from_ms + person.size * 1000 // RATE
        theirs = {
            m["item_id"]
            for m in device.messages[cut:]
            # (audio_start_ms includes server VAD's 300 ms of padding before the voice it heard)
            if m["type"] == SPEECH_STARTED and person_from_ms - 300 <= m["audio_start_ms"] < person_to_ms
        }
        transcribed = [
            m["transcript"]
            for m in device.messages[cut:]
            if m["type"] == "conversation.item.input_audio_transcription.completed" and m["item_id"] in theirs
        ]
        transcripts = device.heard_since(cut)
        understood = words_said & set(words(" ".join(transcripts)))
        assert understood or any(t.strip() for t in transcribed), (transcripts, person_from_ms, vad)
        if device.messages.index(done) < cut:
            pytest.xfail(f"the answer's echo cut it before the person spoke: {device.heard_since(mark)}")
        if not understood:
            # Under double talk AEC3 takes the person where the answer's echo is louder (docs/echo.md,
            # Limits): once in CI their utterance started 1.76 s into "go forward ten meters" and was
            # heard as "This.". Reported, not hidden.
            pytest.xfail(f"the person's words were lost under double talk: heard {transcripts}, {vad}")


async def test_the_server_default_and_where_the_canceller_cannot_run(server_factory: Callable[..., Any]) -> None:
    """``echo_cancellation_default`` auto (the default): a conversation and a device socket's voice loop
    get it, a transcription session holds ``off`` (it speaks nothing), and asking it for ``on`` is an
    error; set to off, neither a conversation nor a voice loop gets it."""
    server: LiveServer = await server_factory()
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(f"{server.url}/v1/realtime?model=gpt-realtime") as ws:
            created = await ws.receive_json()
            assert created["session"]["audio"]["input"]["echo_cancellation"] == "auto", created
        async with http.ws_connect(f"{server.url}/v1/realtime?intent=transcription") as ws:
            created = await ws.receive_json()
            assert created["session"]["audio"]["input"]["echo_cancellation"] == "off", created
            update = {"type": "transcription", "audio": {"input": {"echo_cancellation": "on"}}}
            await ws.send_json({"type": "session.update", "session": update})
            error = await ws.receive_json()
            assert error["type"] == "error", error
            assert error["error"]["code"] == "invalid_value", error
            assert error["error"]["param"] == "session.audio.input.echo_cancellation", error
            assert "transcription session speaks none" in error["error"]["message"], error
        async with http.ws_connect(f"{server.url}/api/ws/asr") as ws:
            await ws.send_json({"type": "start", "mode": "server_vad", "assistant": True})
            ready = await ws.receive_json()
            assert ready["type"] == "ready" and ready["echo_cancellation"] is True, ready
        async with http.ws_connect(f"{server.url}/api/ws/asr") as ws:
            await ws.send_json({"type": "start", "mode": "server_vad"})  # transcription only
            ready = await ws.receive_json()
            assert ready["type"] == "ready" and ready["echo_cancellation"] is False, ready
    off: LiveServer = await server_factory(echo_cancellation_default="off")
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(f"{off.url}/v1/realtime?model=gpt-realtime") as ws:
            created = await ws.receive_json()
            assert created["session"]["audio"]["input"]["echo_cancellation"] == "off", created
        async with http.ws_connect(f"{off.url}/api/ws/asr") as ws:
            await ws.send_json({"type": "start", "mode": "server_vad", "assistant": True})
            ready = await ws.receive_json()
            assert ready["type"] == "ready" and ready["echo_cancellation"] is False, ready


async def test_a_person_over_the_first_answer_of_a_device_without_echo_is_heard_whole(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """A client that cancels its own echo (an SDK app in a browser, a headset: nothing of the answer
    reaches the audio it appends), on the default ``auto``, and a person speaking 0.3 s into the
    first answer, before auto has decided whether the audio carries echo. A Realtime trial found
    them lost: no speech start, no item, the answer played on (the canceller's speech gate held
    the first answer's first seconds and AEC3's suppressor took them). The audio now waits for the
    decision (``echo_auto_hold_ms``) and is heard as it came: the response is cut
    (``turn_detected``) and their words are transcribed."""
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    [(_, person, reference)] = load_clips(default_dir(), ["goforward"])
    async with realtime_device(server, "auto", {"type": "server_vad"}) as device:
        device.gain = 0.0  # its own echo cancellation: the loudspeaker does not reach the microphone
        device.say(speech("Tell me about bees.").audio16k)
        await device.until("response.created", 0)
        await device.condition(lambda: bool(device.frames_at))  # the first answer audio came ...
        mark, played = len(device.messages), device.played_samples
        await device.condition(lambda: device.played_samples >= played + RATE * 3 // 10)  # ... 0.3 s of it played
        person_from_ms = device.mic_samples * 1000 // RATE
        device.say(person)
        done = await device.until("response.done", 0)
        assert done["response"]["status_details"]["reason"] == "turn_detected", done
        await device.settled_past(person_from_ms, mark)
        heard = device.heard_since(mark)
        assert len({*words(reference), "10"} & set(words(" ".join(heard)))) >= 2, (heard, reference)


async def test_a_question_appended_over_the_first_answer_is_heard_when_the_client_stops_appending(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """A client that appends its microphone only while its user speaks (as a push-to-talk app does),
    on the default ``auto``: a question said over the first answer's first seconds is held for auto's
    decision, and the client then sends nothing more. Once no audio has come for
    ``echo_mic_gap_ms`` the held audio is heard (a review: it stayed held, unheard, until whatever
    audio came next)."""
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    [(_, person, _)] = load_clips(default_dir(), ["goforward"])

    def pcm(audio: np.ndarray) -> bytes:
        return bytes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())

    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{server.url}/v1/realtime?model=gpt-realtime", max_msg_size=0) as ws,
    ):
        events: list[dict[str, Any]] = []
        first_delta = asyncio.Event()

        async def read() -> None:
            async for msg in ws:
                event = json.loads(msg.data)
                if event["type"] == "response.output_audio.delta":
                    first_delta.set()
                    continue
                events.append(event)

        reader = asyncio.create_task(read())
        try:
            update = {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}}}}
            await ws.send_json({"type": "session.update", "session": update})

            async def say(audio: np.ndarray) -> None:  # appended in real time, 100 ms at a time
                started = time.monotonic()
                for n, at in enumerate(range(0, audio.size, RATE // 10)):
                    chunk = base64.b64encode(pcm(audio[at : at + RATE // 10])).decode("ascii")
                    await ws.send_json({"type": "input_audio_buffer.append", "audio": chunk})
                    await asyncio.sleep(max(0.0, started + (n + 1) * 0.1 - time.monotonic()))

            quiet = np.zeros(RATE, np.float32)
            await say(np.concatenate([speech("Tell me about bees.").audio16k, quiet]))
            async with asyncio.timeout(60):
                await first_delta.wait()
            # "Go forward", 1.3 s in all: too little for auto to decide on (about 1.8 s of the answer
            # heard), and then the client sends nothing.
            voiced_from, _ = voiced_span(person)
            await say(np.concatenate([person[voiced_from : voiced_from + RATE], quiet[: RATE * 3 // 10]]))
            heard: list[str] = []
            async with asyncio.timeout(30):
                while not heard:
                    heard = [
                        e["transcript"]
                        for e in events
                        if e["type"] == "conversation.item.input_audio_transcription.completed"
                        and {"go", "forward"} & set(words(e["transcript"]))
                    ]
                    await asyncio.sleep(0.05)
            assert any(e["type"] == SPEECH_STARTED for e in events), events
        finally:
            reader.cancel()
