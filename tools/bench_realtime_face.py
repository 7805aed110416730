#!/usr/bin/env python3
"""The Realtime WebSocket face of the voice loop: end of speech → first ``response.output_audio.delta``.

For ``sessions`` concurrent conversation sessions on ``/v1/realtime`` of a running server, each
streams a spoken question in real time (40 ms ``input_audio_buffer.append`` events, then silence)
with server VAD answering by itself, and measures, per turn, on the client's clock:

- ``first_delta_s``: from the moment the last sample of speech was sent to the first
  ``response.output_audio.delta`` (what a user waits for; it includes the VAD's silence window,
  ``silence_duration_ms``, which the session reports);
- ``after_vad_s``: from ``input_audio_buffer.speech_stopped`` arriving to the same delta (the
  server's share: final transcript, LLM first sentence, first TTS audio).

The question's audio comes from the server itself (``POST /v1/audio/speech``, ``pcm`` is 24 kHz),
so nothing but a running server is needed. Importable: ``await measure(url, sessions=4)`` returns
the samples; ``print_figures`` prints the medians. tools/bench_voice_loop.py calls this next to the
WebRTC face.

Usage: python tools/bench_realtime_face.py --url http://127.0.0.1:19401 [--sessions 1 4] [--turns 3]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import websockets

RATE_HZ = 24000
CHUNK_MS = 40
QUESTION = "What color is the sky?"
INSTRUCTIONS = "You are a helpful voice assistant. Answer in one or two short sentences."


@dataclass(frozen=True)
class Sample:
    session: int
    turn: int
    first_delta_s: float
    after_vad_s: float


async def question_audio(url: str, text: str = QUESTION, api_key: str | None = None) -> bytes:
    """``text`` spoken by the server's own TTS: PCM16 at 24 kHz."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm"}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/audio/speech", json=body, headers=headers) as resp:
        resp.raise_for_status()
        return await resp.read()


async def _turn(connection: Any, speech: bytes, silence_s: float) -> tuple[float, float]:
    """Stream one question in real time; returns (first delta after end of speech, after speech_stopped)."""
    chunk = 2 * RATE_HZ * CHUNK_MS // 1000
    audio = speech + bytes(2 * int(RATE_HZ * silence_s))
    started = time.monotonic()
    speech_end: float | None = None
    stopped_at: float | None = None
    first_delta: float | None = None
    reader_done = asyncio.Event()

    async def read() -> None:
        nonlocal stopped_at, first_delta
        async for raw in connection:
            event = json.loads(raw)
            kind = event["type"]
            if kind == "input_audio_buffer.speech_stopped" and stopped_at is None:
                stopped_at = time.monotonic()
            elif kind == "response.output_audio.delta" and first_delta is None:
                first_delta = time.monotonic()
            elif kind == "error":
                raise RuntimeError(f"server error: {event['error']}")
            elif kind == "response.done":
                reader_done.set()
                return

    reader = asyncio.get_running_loop().create_task(read())
    try:
        for index, offset in enumerate(range(0, len(audio), chunk)):
            piece = audio[offset : offset + chunk]
            await connection.send(
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode("ascii")})
            )
            if speech_end is None and offset + chunk >= len(speech):
                speech_end = time.monotonic()
            await asyncio.sleep(max(0.0, started + (index + 1) * CHUNK_MS / 1000 - time.monotonic()))
        await asyncio.wait_for(reader_done.wait(), timeout=120)
    finally:
        reader.cancel()
    if first_delta is None or stopped_at is None or speech_end is None:
        raise RuntimeError("the turn ended without speech_stopped or audio")
    return first_delta - speech_end, first_delta - stopped_at


async def _session(url: str, index: int, turns: int, speech: bytes, api_key: str | None) -> list[Sample]:
    ws_url = url.replace("http", "ws", 1) + "/v1/realtime?model=gpt-realtime"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    samples: list[Sample] = []
    async with websockets.connect(ws_url, additional_headers=headers, max_size=None) as connection:
        created = json.loads(await connection.recv())
        silence_ms = created["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"]
        await connection.send(json.dumps({"type": "session.update", "session": {"instructions": INSTRUCTIONS}}))
        for turn in range(turns):
            first, after_vad = await _turn(connection, speech, silence_s=silence_ms / 1000 + 1.0)
            samples.append(Sample(index, turn, first, after_vad))
    return samples


async def measure(url: str, *, sessions: int = 1, turns: int = 3, api_key: str | None = None) -> list[Sample]:
    """``turns`` questions on each of ``sessions`` concurrent sessions (started together)."""
    speech = await question_audio(url, api_key=api_key)
    results = await asyncio.gather(*(_session(url, n, turns, speech, api_key) for n in range(sessions)))
    return [sample for per_session in results for sample in per_session]


def print_figures(label: str, samples: list[Sample]) -> None:
    first = [s.first_delta_s for s in samples]
    after = [s.after_vad_s for s in samples]
    print(
        f"{label:<28} end of speech → first audio delta: median {statistics.median(first):.2f} s, "
        f"max {max(first):.2f} s; after speech_stopped: median {statistics.median(after):.2f} s "
        f"({len(samples)} turns)"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="a running mediaserver, e.g. http://127.0.0.1:19401")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    for sessions in args.sessions:
        samples = await measure(args.url, sessions=sessions, turns=args.turns, api_key=args.api_key)
        print_figures(f"Realtime WS, {sessions} session{'s' if sessions > 1 else ''}", samples)


if __name__ == "__main__":
    asyncio.run(main())
