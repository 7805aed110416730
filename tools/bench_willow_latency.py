#!/usr/bin/env python3
"""Latency of one utterance through POST /api/willow versus faster-whisper called directly.

Both run in this one process on the same clip, alternating, so machine noise hits both alike:
  A. faster-whisper ``WhisperModel.transcribe`` on the decoded 16 kHz clip (no server at all);
  B. a device-style chunked POST of the raw PCM to a live mediaserver, timed from the last body
     byte to the full response.

Usage: python tools/bench_willow_latency.py [--url http://127.0.0.1:19001] [--runs 20]
Without --url a server is started in-process on a free port with the default settings.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TEXT = "Hey Willow, please turn off all the lights in the living room and then lock the front door."


def synthesize(text: str) -> np.ndarray:
    """Piper speech at 16 kHz, the same samples on every run (tests/conftest.py's synthesis, noise off)."""
    from tests.conftest import synthesize as synthesize_clip

    return np.asarray(synthesize_clip(text).audio16k)


async def read_json_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.decode("latin-1").split("\r\n"):
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    return await reader.readexactly(length)


async def timed_post(url: str, pcm: bytes) -> tuple[float, str]:
    import json
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        writer.write(
            (
                f"POST /api/willow HTTP/1.1\r\nHost: {parts.netloc}\r\nTransfer-Encoding: chunked\r\n"
                "x-audio-codec: pcm\r\n\r\n"
            ).encode()
        )
        for offset in range(0, len(pcm), 2048):
            chunk = pcm[offset : offset + 2048]
            writer.write(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        await writer.drain()
        started = time.perf_counter()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        body = await read_json_response(reader)
        return time.perf_counter() - started, str(json.loads(body)["text"])
    finally:
        writer.close()


async def main_async(args: argparse.Namespace) -> None:
    from faster_whisper import WhisperModel

    from mediaserver.asr.models import bundled_tiny_en_dir
    from mediaserver.audio.decode import float_to_pcm16
    from mediaserver.config import Settings
    from mediaserver.devices import choose_device

    audio = synthesize(TEXT)
    pcm = float_to_pcm16(audio)
    print(f"clip: {audio.size / 16000:.2f} s, {TEXT!r}")
    device = choose_device("auto")
    model_dir = bundled_tiny_en_dir()
    assert model_dir is not None
    direct = WhisperModel(
        str(model_dir), device=device.device, compute_type=device.compute_type, cpu_threads=device.cpu_threads
    )

    runner = None
    url = args.url
    if url is None:
        from aiohttp import web

        from mediaserver.app import create_app
        from tests.ports import bound_port

        app = create_app(Settings(asr_preload_models=["tiny.en"], wyoming_enabled=False))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = bound_port(runner)
        url = f"http://127.0.0.1:{port}"

    def run_direct() -> tuple[float, str]:
        started = time.perf_counter()
        segments, _ = direct.transcribe(audio, language="en", beam_size=1)
        text = "".join(s.text for s in segments).strip()
        return time.perf_counter() - started, text

    try:
        for _ in range(2):  # warm-up both paths
            await asyncio.to_thread(run_direct)
            await timed_post(url, pcm)
        direct_s: list[float] = []
        server_s: list[float] = []
        for _ in range(args.runs):
            d, direct_text = await asyncio.to_thread(run_direct)
            s, server_text = await timed_post(url, pcm)
            direct_s.append(d)
            server_s.append(s)
        print(f"direct text: {direct_text!r}\nserver text: {server_text!r}")
        for name, values in (("faster-whisper direct", direct_s), ("POST /api/willow", server_s)):
            values.sort()
            p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
            print(f"{name:24s} median {statistics.median(values) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms")
        ratio = statistics.median(server_s) / statistics.median(direct_s)
        print(f"ratio server/direct (median): {ratio:.2f}x over {args.runs} alternating runs")
    finally:
        if runner is not None:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start one in-process)")
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
