"""OpenAI Realtime conversations over WebRTC (POST /v1/realtime/calls) with an aiortc client: speech
in on its microphone track, events on ``oai-events``, the answer's audio back on the track and
transcribed again by the server's ASR."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from mediaserver.asr.service import AsrService
from mediaserver.llm.service import LlmService
from mediaserver.state import SESSIONS
from tests.conftest import Clip, LiveServer
from tests.faults import eventually, tasks_ended
from tests.integration.test_realtime_conversation import GA_EVENTS
from tests.integration.test_voice_loop import ANSWER_WORD, LONG_QUESTION, QUESTION, VOICE_SETTINGS, llm_busy, transcribe
from tests.rtc_peer import Peer, answer_frames_arrived, connect_call, record_answer_audio


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def call_server(server_factory: Callable[..., Any]) -> LiveServer:
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    return server


async def events_until(peer: Peer, kind: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        event = await peer.next(timeout=max(0.05, deadline - time.monotonic()))
        GA_EVENTS.validate_python(event)  # the SDK's models accept every event
        got.append(event)
        if event["type"] == kind:
            return got


async def test_call_answers_on_the_track_and_events_on_the_channel(
    call_server: LiveServer,
    asr_service: AsrService,
    llm_service: LlmService,
    speech: Callable[[str], Clip],
    wer: Any,
) -> None:
    session = {"type": "realtime", "instructions": VOICE_SETTINGS["assistant_system_prompt"]}
    peer, location = await connect_call(call_server, session)
    call_id = location.rsplit("/", 1)[1]
    try:
        assert location == f"/v1/realtime/calls/{call_id}" and call_id in call_server.app[SESSIONS].ids()
        assert peer.remote_tracks == 1
        sent = record_answer_audio(call_server.app)
        created = await peer.next("session.created")
        assert created["session"]["instructions"] == VOICE_SETTINGS["assistant_system_prompt"]
        assert created["session"]["id"] == call_id
        peer.track.play(speech(QUESTION), silence_after_s=1.0)
        events = await events_until(peer, "output_audio_buffer.stopped")
        kinds = [e["type"] for e in events]
        expected = [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.committed",
            "conversation.item.input_audio_transcription.completed",
            "response.created",
            "response.output_item.added",
            "response.content_part.added",
            "output_audio_buffer.started",
            "response.output_audio.done",
            "response.output_audio_transcript.done",
            "response.done",
            "output_audio_buffer.stopped",
        ]
        positions = [kinds.index(k) for k in expected]
        assert positions == sorted(positions), kinds
        assert "response.output_audio.delta" not in kinds  # the audio is on the track
        user = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
        assert wer(QUESTION, user["transcript"]) <= 0.2, user
        done = events[kinds.index("response.done")]["response"]
        assert done["status"] in ("completed", "incomplete"), done
        transcript = done["output"][0]["content"][0]["transcript"]
        assert ANSWER_WORD in transcript.lower(), transcript
        await answer_frames_arrived(peer, call_server.app)  # the last frames in flight
        assert len(sent) >= len(peer.received), (len(sent), len(peer.received))  # every frame recorded as sent
        heard = await transcribe(asr_service, peer.received_audio(), 48000)
        if wer(transcript, heard) > 0.2:  # garbled on its way, or sent so?
            pcm = np.frombuffer(b"".join(sent), "<i2").astype(np.float32) / 32768.0
            as_sent = await transcribe(asr_service, pcm, 48000)
            raise AssertionError((transcript, heard, f"as sent: {as_sent!r}", peer.rtp_report()))

        # Speaking over a long answer cuts it off: the track stops, the answer keeps what was played.
        peer.channel.send(json.dumps({"type": "session.update", "session": {"instructions": "You tell long stories."}}))
        await peer.next("session.updated")
        peer.track.play(speech(LONG_QUESTION), silence_after_s=1.0)
        before = await events_until(peer, "output_audio_buffer.started")
        await asyncio.sleep(1.0)  # a second of the story plays
        peer.track.play(speech("Stop please."), silence_after_s=1.0)
        during = await events_until(peer, "response.done")
        kinds = [e["type"] for e in during]
        expected = ["input_audio_buffer.speech_started", "output_audio_buffer.cleared", "response.done"]
        positions = [kinds.index(k) for k in expected]
        assert positions == sorted(positions), kinds
        done = during[-1]["response"]
        assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected")
        written = "".join(
            e["delta"] for e in before + during if e["type"] == "response.output_audio_transcript.delta"
        ).split()
        played = done["output"][0]["content"][0]["transcript"].split()
        assert played == written[: len(played)] and len(played) < len(written), (played, written)

        # An event the server does not know is an error on the channel; the call goes on.
        peer.channel.send(json.dumps({"type": "nope", "event_id": "e1"}))
        error = await peer.next("error")
        assert (error["error"]["code"], error["error"]["event_id"]) == ("invalid_value", "e1")
    finally:
        async with aiohttp.ClientSession() as http, http.post(f"{call_server.url}{location}/hangup") as resp:
            assert resp.status == 200
        await peer.close()
    assert call_id not in call_server.app[SESSIONS].ids()
    assert not llm_busy(llm_service)
    await tasks_ended(call_id)


async def test_raw_sdp_offer_without_a_way_back_for_audio_and_bad_offers(
    call_server: LiveServer, speech: Callable[[str], Clip]
) -> None:
    peer, location = await connect_call(call_server, raw_sdp=True, direction="sendonly")
    call_id = location.rsplit("/", 1)[1]
    try:
        assert (await peer.next("session.created"))["session"]["type"] == "realtime"
        assert peer.remote_tracks == 0  # the offer cannot receive audio: answers are their transcripts
        peer.track.play(speech(QUESTION), silence_after_s=1.0)
        events = await events_until(peer, "response.done")
        assert "output_audio_buffer.started" not in [e["type"] for e in events]
        done = events[-1]["response"]
        assert done["status"] in ("completed", "incomplete"), done
        assert ANSWER_WORD in done["output"][0]["content"][0]["transcript"].lower()
    finally:
        await peer.close()
    deadline = time.monotonic() + 10  # the peer connection closing ends the call
    while call_id in call_server.app[SESSIONS].ids() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert call_id not in call_server.app[SESSIONS].ids()
    async with aiohttp.ClientSession() as http:
        for body, headers, param in (
            ("hello", {"Content-Type": "application/sdp"}, "sdp"),
            ("v=0\r\nnot an offer", {"Content-Type": "application/sdp"}, "sdp"),
        ):
            async with http.post(f"{call_server.url}/v1/realtime/calls", data=body, headers=headers) as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["param"] == param
        form = aiohttp.FormData()
        form.add_field("sdp", "v=0\r\n", content_type="application/sdp")
        form.add_field("session", json.dumps({"type": "transcription"}), content_type="application/json")
        async with http.post(f"{call_server.url}/v1/realtime/calls", data=form) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "session.type"
        async with http.post(f"{call_server.url}/v1/realtime/calls/rtc_nope/hangup") as resp:
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "call_not_found"


async def test_a_client_that_closes_its_event_channel_ends_the_call_logged_as_its_close(
    call_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The client closing ``oai-events`` ends the call, and the log says the client closed it (1000), not
    the code the server closes its own sessions with (1001: a user trial read a vanished client so)."""
    peer, location = await connect_call(call_server)
    call_id = location.rsplit("/", 1)[1]
    try:
        await peer.next("session.created")
        with caplog.at_level(logging.INFO, logger="mediaserver.transport.socket_session"):
            peer.channel.close()
            deadline = time.monotonic() + 10
            while call_id in call_server.app[SESSIONS].ids() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert call_id not in call_server.app[SESSIONS].ids()
            closed = [r.getMessage() for r in caplog.records if f"session {call_id}: closed" in r.getMessage()]
        assert len(closed) == 1 and "(code 1000)" in closed[0], closed
        # Hanging up a call the client already ended is a 200, as the call is over (a browser trial's
        # cleanup, closing then hanging up as OpenAI's examples do, got a 404 every time); an id that
        # was never a call stays a 404.
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.post(f"{call_server.url}{location}/hangup") as response:
                    assert response.status == 200
            async with http.post(f"{call_server.url}/v1/realtime/calls/rtc_never/hangup") as response:
                assert response.status == 404
    finally:
        await peer.close()
    await tasks_ended(call_id)


async def test_a_silent_sender_still_moves_the_calls_audio_clock(
    call_server: LiveServer, speech: Callable[[str], Clip]
) -> None:
    """A browser trial: Chrome sends Opus DTX in silence (a packet now and then, timestamps jumping),
    and the server counted only the audio that came, so a question 1.5 s into the call got
    ``audio_start_ms`` 150, and ``idle_timeout_ms`` counted only the packets. The time the sender
    skipped counts now: 2 s sent as nothing before a question, and 5 s after its answer."""
    session = {
        "type": "realtime",
        "output_modalities": ["text"],
        "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 3000}}},
    }
    question = speech(QUESTION)  # (synthesized now: Piper holds the loop the client shares)
    quiet = Clip("", np.zeros(11025, np.int16))  # 0.5 s sent as silence
    peer, _ = await connect_call(call_server, session)

    async def go_quiet(seconds: float) -> None:
        """Some silence sent, then none for ``seconds`` (the track's timestamps jump past it)."""
        peer.track.play(quiet, silence_after_s=0.0)
        await peer.track.played.wait()
        peer.track.quiet_from = None
        peer.track.go_quiet(seconds)
        await eventually(lambda: peer.track.quiet_from is not None, 10, 0.005)

    try:
        await peer.next("session.created")
        await go_quiet(2.0)  # (under idle_timeout_ms with the silence sent: no idle answer before the question)
        peer.track.play(question, silence_after_s=0.3)
        started = (await events_until(peer, "input_audio_buffer.speech_started"))[-1]
        assert started["audio_start_ms"] >= 2000, started
        await events_until(peer, "response.done")
        await go_quiet(5.0)  # after the answer (the idle count starts there)
        triggered = (await events_until(peer, "input_audio_buffer.timeout_triggered", timeout=30))[-1]
        # Counted with the gap, the silent stretch is the gap (over 3 s at once), not 3 s of packets after it.
        assert triggered["audio_end_ms"] - triggered["audio_start_ms"] >= 4500, triggered
    finally:
        await peer.close()
