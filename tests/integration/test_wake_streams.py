"""Wake words on our own streams (device WebSocket, ``wake`` start option): nothing reaches ASR
until the wake word is heard, then one utterance (or a conversation) is transcribed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tests.conftest import SENTENCES, LiveServer, synthesize
from tests.integration.test_ws_stream import Client, connect, pcm16, silence

FRAME = 640  # 20 ms of 16 kHz PCM16


def said(text: str) -> np.ndarray:
    return np.concatenate([synthesize(text).audio16k, silence(1.5)])


async def send(client: Client, audio: np.ndarray) -> None:
    await client.send_audio(pcm16(audio), FRAME)


async def test_only_the_command_after_the_wake_word_is_transcribed(server: LiveServer, wer: Any) -> None:
    async with connect(server) as client:
        ready = await client.start(mode="server_vad", wake="okay_nabu", language="en")
        assert ready["wake"] == ["okay_nabu"]
        await send(client, np.concatenate([silence(0.5), said(SENTENCES["weather"])]))  # no wake word: ignored
        await send(client, said("okay nabu, turn on the lights"))
        got = await client.until("final", timeout=60)
        kinds = [m["type"] for m in got]
        assert "wake_word" in kinds and kinds.index("wake_word") < kinds.index("final"), kinds
        heard = next(m for m in got if m["type"] == "wake_word")
        assert heard["name"] == "okay_nabu" and heard["phrase"] == "Okay Nabu"
        assert wer("turn on the lights", got[-1]["text"]) <= 0.25, got[-1]
        # One stream clock: the audio held back while waiting for the word counts too (it used to
        # restart at 0, so the command "began" before the wake word that opened it).
        assert got[-1]["audio_start_ms"] >= heard["audio_ms"] - 1000, (heard, got[-1])
        waiting = (await client.until("wake_waiting", timeout=30))[-1]
        assert waiting["reason"] == "utterance_done" and waiting["names"] == ["okay_nabu"]
        # Back to waiting: this sentence is not transcribed, the next command is.
        await send(client, said(SENTENCES["remind"]))
        await send(client, said("okay nabu, close the garage door"))
        got = await client.until("final", timeout=60)
        assert wer("close the garage door", got[-1]["text"]) <= 0.25, got[-1]


async def test_after_a_second_start_the_wake_word_and_the_command_share_one_clock(server: LiveServer, wer: Any) -> None:
    """A docs audit: each start made a new detector whose clock began at 0, while the stream's
    (the finals' times) goes on, so after a second start the wake word "came" before its command
    by the length of everything said before."""
    async with connect(server) as client:
        await client.start(mode="server_vad", wake="okay_nabu", language="en")
        await send(client, np.concatenate([silence(0.5), said(SENTENCES["weather"])]))  # 6 s or so, unheard
        await client.start(mode="server_vad", wake="okay_nabu", language="en")
        await send(client, said("okay nabu, turn on the lights"))
        got = await client.until("final", timeout=60)
        heard = next(m for m in got if m["type"] == "wake_word")
        final = got[-1]
        assert wer("turn on the lights", final["text"]) <= 0.25, final
        assert heard["audio_ms"] - 1500 <= final["audio_start_ms"] <= heard["audio_ms"] + 1000, (heard, final)


async def test_no_command_after_the_wake_word_goes_back_to_waiting(
    server_factory: Callable[..., Any],
) -> None:
    live = await server_factory(wake_listen_timeout_s=1.0)
    async with connect(live) as client:
        await client.start(mode="server_vad", wake=True)  # wake_default_models: okay_nabu
        await send(client, np.concatenate([synthesize("okay nabu").audio16k, silence(3.0)]))
        got = await client.until("wake_waiting", timeout=30)
        assert [m["type"] for m in got if m["type"] != "pong"] == ["wake_word", "wake_waiting"], got
        assert got[-1]["reason"] == "no_speech"


async def test_conversation_keeps_listening_until_its_timeout(server_factory: Callable[..., Any], wer: Any) -> None:
    live = await server_factory(wake_conversation_timeout_s=2.5)
    async with connect(live) as client:
        await client.start(mode="server_vad", wake=["hey_jarvis"], language="en")
        await send(client, said("hey jarvis, turn on the lights"))
        await send(client, said(SENTENCES["kitchen"]))  # within the conversation: no wake word needed
        finals = [m for m in await client.until("final", timeout=60) if m["type"] == "final"]
        finals += [m for m in await client.until("final", timeout=60) if m["type"] == "final"]
        assert wer("turn on the lights", finals[0]["text"]) <= 0.25, finals
        assert wer(SENTENCES["kitchen"], finals[1]["text"]) <= 0.25, finals
        await send(client, silence(4.0))
        waiting = (await client.until("wake_waiting", timeout=30))[-1]
        assert waiting["reason"] == "conversation_timeout"


async def test_bad_wake_options_are_errors(server: LiveServer) -> None:
    async with connect(server) as client:
        await client.send("start", mode="push_to_talk", wake=True)
        error = (await client.until("error"))[-1]
        assert error["code"] == "invalid_parameter" and "server_vad" in error["message"], error
        await client.send("start", mode="server_vad", wake="hey_computer")
        error = (await client.until("error"))[-1]
        assert error["code"] == "model_not_found" and "okay_nabu" in error["message"], error
        await client.send("start", mode="server_vad", wake=12)
        error = (await client.until("error"))[-1]
        assert error["code"] == "invalid_parameter", error
        ready = await client.start(mode="server_vad")
        assert ready["wake"] is None
