#!/usr/bin/env python3
"""What the server's memory (RSS) is made of: the runtime, each model, the first decodes, and
open WebRTC sessions, some of them speaking.

Child servers (``python -m mediaserver``, LLM and TTS off) are started one after the other so each
part is measured on its own:

1. no model loaded: Python, aiohttp, aiortc, CTranslate2 and the rest of the imports;
2. ``tiny.en`` preloaded; 3. ``tiny.en`` and ``base`` preloaded;
4. in server 3: one push-to-talk utterance through each model over WebRTC (CTranslate2's work
   buffers, the Silero VAD's ONNX session, PyAV's Opus decoder);
5. ``--sessions`` WebRTC sessions (aiortc peers on loopback), all paused as the ``/rtc`` page pauses
   between utterances;
6. half of them speaking: push-to-talk utterances with partials, back to back for ``--speak-s``,
   on ``tiny.en``;
   RSS sampled every 0.25 s (peak and last).

    python tools/bench_memory.py [--sessions 50] [--speak-s 60]

Target (issue #15): RSS ≤ 600 MB with tiny.en and base loaded and 50 sessions open, half speaking.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, child_server

sys.path.insert(0, str(REPO))

ASR_ONLY = {"MEDIASERVER_LLM_ENABLED": "false", "MEDIASERVER_TTS_ENABLED": "false"}
MB = 2**20


class _Server:
    def __init__(self, url: str) -> None:
        self.url = url


def rss_mb(pid: int) -> float:
    import psutil

    return float(psutil.Process(pid).memory_info().rss / MB)


def settle_rss_mb(pid: int, seconds: float = 3.0) -> float:
    time.sleep(seconds)
    return rss_mb(pid)


def server_rss(preload: list[str], label: str) -> float:
    env = ASR_ONLY | {"MEDIASERVER_ASR_PRELOAD_MODELS": json.dumps(preload)}
    with child_server(REPO / "bench-results" / f"bench-memory-{label}.log", 300.0, env) as (_, process):
        return settle_rss_mb(process.pid)


async def utterance(peer: Any, clip: Any, model: str | None = None, partials: bool = False) -> str:
    peer.resume()
    peer.send("start", {"partials": partials} | ({"model": model} if model else {}))
    await peer.next("log")
    duration = peer.track.play(clip, silence_after_s=0.3)
    await asyncio.sleep(duration + 0.2)
    peer.send("stop")
    infer = await peer.next("infer", timeout=120)
    await peer.pause()
    return str(infer["obj"]["text"])


async def sessions_phase(url: str, pid: int, sessions: int, speak_s: float) -> dict[str, Any]:
    from tests.conftest import SENTENCES, synthesize
    from tests.rtc_peer import Peer, connect

    clips = [synthesize(text) for text in SENTENCES.values()]
    result: dict[str, Any] = {"models_loaded_mb": rss_mb(pid)}
    first = await connect(_Server(url))
    texts = [await utterance(first, clips[0]), await utterance(first, clips[1], "base")]
    await first.close()
    await asyncio.sleep(3.0)
    result["after_first_decodes_mb"] = rss_mb(pid)
    result["first_decode_texts"] = texts
    peers: list[Peer] = []
    for index in range(sessions):
        peer = await connect(_Server(url))
        await peer.pause()
        peers.append(peer)
        if (index + 1) % 10 == 0:
            print(f"  {index + 1} sessions open", flush=True)
    await asyncio.sleep(5.0)
    result["sessions_open_mb"] = rss_mb(pid)
    speakers = peers[: sessions // 2]
    samples: list[float] = []
    answered = 0
    stop_at = time.monotonic() + speak_s

    async def speak(peer: Peer, offset: int) -> None:
        nonlocal answered
        await asyncio.sleep(offset * 0.13)
        k = offset
        while time.monotonic() < stop_at:
            if (await utterance(peer, clips[k % len(clips)], partials=True)).strip():
                answered += 1
            k += 1

    async def sample() -> None:
        while True:
            samples.append(rss_mb(pid))
            await asyncio.sleep(0.25)

    sampler = asyncio.get_running_loop().create_task(sample())
    results = await asyncio.gather(*(speak(p, i) for i, p in enumerate(speakers)), return_exceptions=True)
    sampler.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampler
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    result |= {
        "speaking_peak_mb": max(samples),
        "speaking_last_mb": samples[-1],
        "utterances_answered": answered,
        "speaker_errors": errors[:3],
    }
    for peer in peers:
        await peer.close()
    await asyncio.sleep(5.0)
    result["sessions_closed_mb"] = rss_mb(pid)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--speak-s", type=float, default=60.0)
    parser.add_argument("--json", type=Path, default=REPO / "bench-results" / "bench-memory.json")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    rows: dict[str, Any] = {}
    print("runtime without models…", flush=True)
    rows["no_model_mb"] = server_rss([], "none")
    print("tiny.en…", flush=True)
    rows["tiny_en_mb"] = server_rss(["tiny.en"], "tiny")
    print("tiny.en + base, then sessions…", flush=True)
    env = ASR_ONLY | {
        "MEDIASERVER_ASR_PRELOAD_MODELS": json.dumps(["tiny.en", "base"]),
        "MEDIASERVER_MAX_SESSIONS": str(args.sessions + 10),
    }
    with child_server(REPO / "bench-results" / "bench-memory-sessions.log", 300.0, env) as (url, process):
        settle_rss_mb(process.pid)
        rows |= asyncio.run(sessions_phase(url, process.pid, args.sessions, args.speak_s))
    rows["load_average"] = {"start": load_start, "end": os.getloadavg()[0]}
    n = args.sessions
    print(f"\nRSS, MB (load average {load_start:.2f} → {os.getloadavg()[0]:.2f}):")
    print(f"  runtime, no model                {rows['no_model_mb']:7.0f}")
    print(
        f"  + tiny.en                        {rows['tiny_en_mb']:7.0f}  "
        f"(+{rows['tiny_en_mb'] - rows['no_model_mb']:.0f})"
    )
    print(
        f"  + base                           {rows['models_loaded_mb']:7.0f}  "
        f"(+{rows['models_loaded_mb'] - rows['tiny_en_mb']:.0f})"
    )
    print(
        f"  after one decode on each         {rows['after_first_decodes_mb']:7.0f}  "
        f"(+{rows['after_first_decodes_mb'] - rows['models_loaded_mb']:.0f}: work buffers, Silero VAD, Opus)"
    )
    per_session = (rows["sessions_open_mb"] - rows["after_first_decodes_mb"]) * 1024 / n
    print(f"  {n} paused WebRTC sessions        {rows['sessions_open_mb']:7.0f}  ({per_session:.0f} KB per session)")
    print(
        f"  {n // 2} of them speaking (peak)      {rows['speaking_peak_mb']:7.0f}  "
        f"(last {rows['speaking_last_mb']:.0f}; {rows['utterances_answered']} utterances answered)"
    )
    print(f"  all closed                       {rows['sessions_closed_mb']:7.0f}")
    print(f"  target: peak ≤ 600 MB: {'ok' if rows['speaking_peak_mb'] <= 600 else 'MISSED'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))
    print(f"raw: {args.json}")


if __name__ == "__main__":
    main()
