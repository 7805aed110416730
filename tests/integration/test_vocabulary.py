"""Vocabulary on every face, with the real model and a real recording: what a prompt fixes, that the
server-wide ``asr_vocabulary`` reaches every decode, and that a prompt too long is refused in each
face's own shape (asr/vocabulary.py; the bound and the merge alone: tests/unit/test_vocabulary.py).

The recording is LibriVox's "he was not an ill disposed young man" (tests/human_speech.py), which
tiny.en hears as "old-sposed"; given "ill-disposed" it writes it. Each test measures both sides, so
it fails if the model stops mishearing (nothing left to prove) or the prompt stops reaching it.
"""

from __future__ import annotations

import asyncio
import io
import re
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import numpy as np
import pytest
from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event

from mediaserver.asr.service import AsrService
from mediaserver.events import Priority, Transcript, TranscriptionOptions
from mediaserver.state import SETTINGS
from mediaserver.transport.wyoming.server import WyomingServer
from tests.conftest import LiveServer, synthesize
from tests.human_speech import default_dir, load_clips
from tests.integration.test_realtime import Client as RealtimeClient
from tests.integration.test_realtime import assert_error, configure
from tests.integration.test_ws_stream import connect as ws_connect
from tests.integration.test_ws_stream import pcm16

pytestmark = pytest.mark.asyncio(loop_scope="session")

WORD = "ill-disposed"
OTHER_NAMES = "Kubernetes, Nguyen, Siobhan"  # a vocabulary that is not this recording's
TOO_LONG = "x" * 601  # past the default asr_max_prompt_chars (600)


@pytest.fixture(scope="module")
def recording() -> np.ndarray:
    [(_, audio, reference)] = load_clips(default_dir(), ["librivox_0880"])
    assert reference == "he was not an ill disposed young man"
    return audio


def heard(text: str) -> bool:
    """Whether the transcript has the rare word (hyphenated or not)."""
    return re.search(r"\bill[- ]disposed\b", text.lower()) is not None


def wav16(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm16(audio))
    return buf.getvalue()


@contextmanager
def vocabulary(asr_service: AsrService, words: str) -> Iterator[None]:
    """The shared service with ``asr_vocabulary`` set, as a server started with it has."""
    saved = asr_service.settings
    asr_service.settings = saved.model_copy(update={"asr_vocabulary": words})
    try:
        yield
    finally:
        asr_service.settings = saved


async def final(asr_service: AsrService, audio: np.ndarray, prompt: str | None = None) -> Transcript:
    options = TranscriptionOptions(language="en", with_segment_timestamps=False, initial_prompt=prompt)
    return await asr_service.transcribe(audio, options, model="tiny.en", priority=Priority.FINAL)


async def test_the_server_vocabulary_fixes_a_real_recordings_rare_word(
    asr_service: AsrService, recording: np.ndarray
) -> None:
    """Without it tiny.en mishears the word; other names change nothing; the word fixes it, in the
    vocabulary or in the session's own prompt after another vocabulary."""
    plain = await final(asr_service, recording)
    assert not heard(plain.text) and "old" in plain.text.lower(), plain.text
    with vocabulary(asr_service, OTHER_NAMES):
        assert not heard((await final(asr_service, recording)).text)
        own = await final(asr_service, recording, prompt=WORD)  # runs as "Kubernetes, ... ill-disposed"
        assert heard(own.text), own.text
    with vocabulary(asr_service, WORD):
        fixed = await final(asr_service, recording)
    assert heard(fixed.text) and fixed.text.lower().count("young man") == 1, fixed.text


async def test_names_piper_says_are_fixed_by_naming_them(asr_service: AsrService) -> None:
    audio = synthesize("Ask Siobhan to send the report to Mister Nguyen.").audio16k
    plain = (await final(asr_service, audio)).text
    assert "Siobhan" not in plain and "Nguyen" not in plain, plain
    named = (await final(asr_service, audio, prompt="Siobhan, Nguyen")).text
    assert "Siobhan" in named and "Nguyen" in named, named


async def test_a_prompted_final_says_a_short_sentence_once(asr_service: AsrService) -> None:
    """A prompt on tiny.en's 10 s window made it say the sentence twice; prompted decodes get the
    full window (engine.py), where it is said once. Partials too."""
    [(_, audio, _)] = load_clips(default_dir(), ["arctic_a0009"])
    for priority in (Priority.FINAL, Priority.PARTIAL):
        options = TranscriptionOptions(language="en", with_segment_timestamps=False, initial_prompt="Gregson")
        text = (await asr_service.transcribe(audio, options, model="tiny.en", priority=priority)).text
        assert text.lower().count("turned sharply") == 1 and "Gregson" in text, text


# --- each face carries its prompt to the model -----------------------------------------------------


async def test_each_face_carries_its_prompt_to_the_model(
    server: LiveServer, base_settings: Any, asr_service: AsrService, recording: np.ndarray
) -> None:
    """WIS's new ``prompt`` query parameter, the OpenAI upload's ``prompt``, the device WebSocket's
    ``prompt`` and Wyoming's ``transcript_terms``: each fixes the word."""
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/api/asr?prompt={WORD}", data=_form("audio_file", recording)) as resp:
            assert resp.status == 200 and heard((await resp.json())["text"])
        form = _form("file", recording, model="whisper-1", prompt=WORD)
        async with http.post(f"{server.url}/v1/audio/transcriptions", data=form) as resp:
            assert resp.status == 200 and heard((await resp.json())["text"])
    async with ws_connect(server) as client:
        ready = await client.start(mode="push_to_talk", prompt=WORD)
        assert ready["prompt"] == WORD
        await client.send_audio(pcm16(recording), 3200)
        await client.send("stop")
        assert heard((await client.until("final"))[-1]["text"])
    wyoming = WyomingServer(base_settings, asr_service)
    await wyoming.start("127.0.0.1", 0)
    try:
        assert wyoming.port is not None
        events = await _wyoming_stt(wyoming.port, recording, transcript_terms=[WORD])
        assert events[-1].type == "transcript" and heard(events[-1].data["text"]), events[-1]
    finally:
        await wyoming.aclose()


def _form(field: str, audio: np.ndarray, **values: str) -> aiohttp.FormData:
    form = aiohttp.FormData(default_to_multipart=True)
    for name, value in values.items():
        form.add_field(name, value)
    form.add_field(field, wav16(audio), filename="speech.wav", content_type="audio/wav")
    return form


async def _wyoming_stt(port: int, audio: np.ndarray | None, **transcribe: Any) -> list[Event]:
    """A ``transcribe`` with ``transcribe``'s fields, then the audio; events up to the transcript or error."""
    client = AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    events: list[Event] = []
    try:
        await client.write_event(Transcribe(language="en", **transcribe).event())
        if audio is not None:
            await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            data = pcm16(audio)
            for offset in range(0, len(data), 2048):
                await client.write_event(
                    AudioChunk(rate=16000, width=2, channels=1, audio=data[offset : offset + 2048]).event()
                )
            await client.write_event(AudioStop().event())
        while True:
            event = await asyncio.wait_for(client.read_event(), timeout=60)
            assert event is not None, f"closed before a transcript or an error: {[e.type for e in events]}"
            events.append(event)
            if event.type in ("transcript", "error"):
                return events
    finally:
        await client.disconnect()


# --- a prompt too long, refused in each face's shape -----------------------------------------------


async def test_a_prompt_too_long_is_refused_in_each_faces_shape(
    server: LiveServer, base_settings: Any, asr_service: AsrService, recording: np.ndarray
) -> None:
    assert server.app[SETTINGS].asr_max_prompt_chars == 600
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/api/asr?prompt={TOO_LONG}", data=_form("audio_file", recording)) as resp:
            body = await resp.json()
            assert resp.status == 400 and body["code"] == "invalid_parameter", body
            assert "at most 600 (asr_max_prompt_chars)" in body["error"], body
        form = _form("file", recording, model="whisper-1", prompt=TOO_LONG)
        async with http.post(f"{server.url}/v1/audio/transcriptions", data=form) as resp:
            error = (await resp.json())["error"]
            assert resp.status == 400 and error["param"] == "prompt" and "601 characters" in error["message"], error
        offer = {"sdp": "v=0", "type": "offer"}
        async with http.post(f"{server.url}/api/rtc/asr?prompt={TOO_LONG}", json=offer) as resp:
            assert resp.status == 400 and "asr_max_prompt_chars" in (await resp.json())["error"]
        ws = await http.ws_connect(f"{server.url}/v1/realtime?intent=transcription")
        realtime = RealtimeClient(ws)
        try:
            await realtime.next("transcription_session.created", "session.created")
            session = {"type": "transcription", "audio": {"input": {"transcription": {"prompt": TOO_LONG}}}}
            assert_error(
                await configure(realtime, session),
                "string_above_max_length",
                "session.audio.input.transcription.prompt",
            )
        finally:
            await realtime.close()
    async with ws_connect(server) as client:
        await client.send("start", mode="push_to_talk", prompt=TOO_LONG)
        error = (await client.until("error"))[-1]
        assert error["code"] == "invalid_parameter" and error["param"] == "prompt", error
        ready = await client.start(mode="push_to_talk", prompt=WORD)  # the session goes on
        assert ready["prompt"] == WORD
    wyoming = WyomingServer(base_settings, asr_service)
    await wyoming.start("127.0.0.1", 0)
    try:
        assert wyoming.port is not None
        events = await _wyoming_stt(wyoming.port, None, transcript_names=["x" * 300, "y" * 300])
        assert events[-1].type == "error" and events[-1].data["code"] == "invalid_parameter", events[-1]
        assert "602 characters" in events[-1].data["text"], events[-1]
    finally:
        await wyoming.aclose()
