"""``turn_detection.idle_timeout_ms`` in Realtime conversation sessions, through the official SDK.

After that much input audio without speech and with no answer under way, the server sends
``input_audio_buffer.timeout_triggered``, commits the silent stretch as a user audio item and
answers (the bundled SmolLM2, text out). Every server event is validated against the SDK's models.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest_asyncio

from tests.conftest import Clip, LiveServer
from tests.integration.test_realtime import RATE, chunks, pcm16
from tests.integration.test_realtime_conversation import GA_EVENTS, in_order, sdk, until
from tests.integration.test_voice_loop import VOICE_SETTINGS

CHUNK_BYTES = 2 * RATE // 10  # 100 ms of 24 kHz PCM16
ANSWER = ["response.created", "response.output_item.added", "response.output_text.done", "response.done"]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def idle_server(server_factory: Callable[..., Any]) -> LiveServer:
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    return server


def _silence(seconds: float) -> bytes:
    return bytes(np.zeros(int(seconds * RATE), "<i2").tobytes())


async def _append(connection: Any, pcm: bytes) -> None:
    for piece in chunks(pcm, CHUNK_BYTES):
        await connection.input_audio_buffer.append(audio=base64.b64encode(piece).decode("ascii"))


async def _configure(connection: Any, idle_timeout_ms: int | None) -> list[Any]:
    """Text answers, server VAD with ``idle_timeout_ms``; returns the events up to session.updated.
    Audio and session updates are handled in order, so this is also a barrier after appended audio."""
    turn = {"type": "server_vad", "idle_timeout_ms": idle_timeout_ms}
    await connection.session.update(
        session={"type": "realtime", "output_modalities": ["text"], "audio": {"input": {"turn_detection": turn}}}
    )
    return await until(connection, "session.updated")


async def test_idle_timeout_commits_the_silence_and_answers(idle_server: LiveServer) -> None:
    async with sdk(idle_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        updated = await _configure(connection, 2000)
        assert updated[-1].session.audio.input.turn_detection.idle_timeout_ms == 2000
        await _append(connection, _silence(3.0))
        events = await until(connection, "response.done")
    kinds = [e.type for e in events]
    assert in_order(
        kinds,
        ["input_audio_buffer.timeout_triggered", "input_audio_buffer.committed", "conversation.item.added", *ANSWER],
    ), kinds
    assert kinds.count("input_audio_buffer.timeout_triggered") == 1, kinds
    assert "input_audio_buffer.speech_started" not in kinds
    timeout = next(e for e in events if e.type == "input_audio_buffer.timeout_triggered")
    assert timeout.audio_start_ms == 0
    assert 2000 <= timeout.audio_end_ms - timeout.audio_start_ms < 2000 + 200, timeout
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    assert committed.item_id == timeout.item_id
    added = next(e for e in events if e.type == "conversation.item.added")
    assert added.item.id == timeout.item_id and added.item.role == "user"
    done = events[-1].response
    assert done.status in ("completed", "incomplete"), done


async def test_idle_count_starts_after_the_answer(idle_server: LiveServer, speech: Callable[[str], Clip]) -> None:
    """A spoken turn and its answer restart the count; silence shorter than the time-out triggers
    nothing; the rest of it does, measured from the answer's end."""
    async with sdk(idle_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await _configure(connection, 3000)
        await _append(connection, pcm16(speech("What do bees make?"), silence_after_s=1.0))
        turn = await until(connection, "response.done")
        assert "input_audio_buffer.speech_started" in [e.type for e in turn]
        assert "input_audio_buffer.timeout_triggered" not in [e.type for e in turn]
        await _append(connection, _silence(2.0))
        quiet = await _configure(connection, 3000)  # a barrier: the 2 s have been counted
        assert "input_audio_buffer.timeout_triggered" not in [e.type for e in quiet], [e.type for e in quiet]
        await _append(connection, _silence(1.5))
        events = await until(connection, "response.done")
    kinds = [e.type for e in events]
    assert in_order(kinds, ["input_audio_buffer.timeout_triggered", "input_audio_buffer.committed", *ANSWER]), kinds
    timeout = next(e for e in events if e.type == "input_audio_buffer.timeout_triggered")
    assert 3000 <= timeout.audio_end_ms - timeout.audio_start_ms < 3000 + 200, timeout


async def test_without_idle_timeout_silence_is_just_silence(idle_server: LiveServer) -> None:
    async with sdk(idle_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await _configure(connection, None)
        await _append(connection, _silence(4.0))
        events = await _configure(connection, None)
    assert [e.type for e in events] == ["session.updated"], [e.type for e in events]


async def test_bad_idle_timeout_is_an_error_event(idle_server: LiveServer) -> None:
    async with sdk(idle_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        turn = {"type": "server_vad", "idle_timeout_ms": -5}
        await connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": turn}}})
        (error,) = await until(connection, "error")
    assert error.error.param == "session.audio.input.turn_detection.idle_timeout_ms", error
    GA_EVENTS.validate_python(error.model_dump())
