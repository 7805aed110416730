#!/usr/bin/env python3
"""Streaming vs upload on real human speech: does a streamed final say what an upload says?

The 17 real recordings of ``tests/human_speech.py`` (commands of 1-2 s, sentences, JFK) are streamed
in real time over the device WebSocket (server VAD, partials and unstable partials on, as the /rtc
page asks) by 1 and 4 concurrent sessions (``--sessions``), each session speaking every clip in its
own rotation, and each clip is uploaded to ``/v1/audio/transcriptions`` by as many concurrent
clients. Per configuration (a child server, ``--config`` as in bench_streaming.py, so an older tree
can run beside this one and both are measured in alternation in one run) and level it prints:

- corpus WER of the streamed finals and of the uploads against the references (tests/wer.py, with
  ``spoken_form``: Whisper writes "10 of clubs" for "ten of clubs");
- **looping finals**: a clip whose streamed text holds more than one word more than its upload, or
  a phrase the repetition guard calls a loop;
- loop-guard redecodes (finals carrying ``guard``; ``mediaserver_asr_guard_total`` from /metrics);
- final latency after ``speech_stopped`` (client side, p50/p95), and for finals that were decoded
  again, what that cost (server ``latency_ms`` of guarded vs other finals).

Targets (issue #22): streaming WER ≤ upload WER + 0.5 points at 1 and 4 sessions, zero looping
finals, final latency p50 ≤ 0.4 s at 1 session.

    python tools/eval_parity.py
    git worktree add /tmp/ms-old <commit>
    python tools/eval_parity.py --config new: --config old@/tmp/ms-old: --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from bench_streaming import ASR_ONLY, Clip, Config, parse_config, stream_session
from benchlib import REPO, child_server, median, percentile

sys.path.insert(0, str(REPO))

RATE = 16000
STAGGER_S = 0.37
TARGET_WER_GAP = 0.005
TARGET_FINAL_P50_S = 0.4


def corpus_wer(references: list[str], hypotheses: list[str]) -> float:
    from tests.wer import corpus_wer as wer
    from tests.wer import spoken_form

    result = wer([spoken_form(r) for r in references], [spoken_form(h) for h in hypotheses])
    return float("nan") if result is None else result


def load_human() -> list[Clip]:
    from tests.human_speech import default_dir, load_clips

    clips = []
    for _, audio, reference in load_clips(default_dir()):
        frames = audio[: audio.size // 160 * 160].reshape(-1, 160)
        rms = np.sqrt((frames**2).mean(axis=1))
        loud = np.flatnonzero(rms > max(0.01, 4 * float(np.percentile(rms, 10))))
        clips.append(Clip(reference, audio, loud[0] * 0.01, (loud[-1] + 1) * 0.01))
    return clips


async def upload(url: str, clip: Clip) -> str:
    import aiohttp

    from tests.human_speech import wav_bytes

    form = aiohttp.FormData()
    form.add_field("file", wav_bytes(clip.audio), filename="clip.wav", content_type="audio/wav")
    form.add_field("model", "whisper-1")
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/audio/transcriptions", data=form) as response:
        body = await response.json()
        return str(body.get("text", "")) if response.status == 200 else ""


def guard_redecodes(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mediaserver_asr_guard_total{") and 'action="redecode"' in line
    )


async def run_level(url: str, clips: list[Clip], sessions: int) -> dict[str, Any]:
    before = guard_redecodes(url)
    rotations = [clips[s * len(clips) // sessions :] + clips[: s * len(clips) // sessions] for s in range(sessions)]
    spoken = await asyncio.gather(
        *(stream_session(url, rotation, s * STAGGER_S) for s, rotation in enumerate(rotations))
    )
    uploads: dict[str, list[str]] = {clip.text: [] for clip in clips}
    for _ in range(sessions):
        texts = await asyncio.gather(*(upload(url, clip) for clip in clips))
        for clip, text in zip(clips, texts, strict=True):
            uploads[clip.text].append(text)
    rows = [s.metrics() for session in spoken for s in session]
    return {"rows": rows, "uploads": uploads, "guard_redecodes": guard_redecodes(url) - before}


def summarize(level: dict[str, Any]) -> dict[str, Any]:
    from mediaserver.asr.guards import normalized_words, repeated_phrase

    rows, uploads = level["rows"], level["uploads"]
    references = [r["text"] for r in rows]
    upload_refs = [ref for ref, texts in uploads.items() for _ in texts]
    upload_hyps = [text for texts in uploads.values() for text in texts]
    looping = []
    for r in rows:
        upload_words = min(len(normalized_words(t)) for t in uploads[r["text"]])
        words = normalized_words(r["final"])
        if len(words) > upload_words + 1 or repeated_phrase(words, 3) is not None:
            looping.append(r["final"])
    finals = [x for r in rows for x in r["final_latency_s"]]
    guarded = [ms for r in rows for g, ms in zip(r["guards"], r["server_latency_ms"], strict=False) if g]
    plain = [ms for r in rows for g, ms in zip(r["guards"], r["server_latency_ms"], strict=False) if not g]
    return {
        "clips": len(rows),
        "stream_wer": corpus_wer(references, [r["final"] for r in rows]),
        "upload_wer": corpus_wer(upload_refs, upload_hyps),
        "looping_finals": looping,
        "guarded_finals": sum(bool(g) for r in rows for g in r["guards"]),
        "guard_redecodes_metric": level["guard_redecodes"],
        "final_p50_s": median(finals),
        "final_p95_s": percentile(finals, 95),
        "server_latency_guarded_p50_ms": median(guarded) if guarded else None,
        "server_latency_other_p50_ms": median(plain) if plain else None,
        "without_final": sum(not r["final"] for r in rows),
    }


async def measure(urls: dict[str, str], clips: list[Clip], levels: list[int], rounds: int) -> dict[str, Any]:
    results: dict[str, dict[int, list[dict[str, Any]]]] = {name: {n: [] for n in levels} for name in urls}
    for name, url in urls.items():
        await stream_session(url, clips[:1], 0.0)  # warm-up
        print(f"  {name} warmed up", flush=True)
    names = list(urls)
    for r in range(rounds):
        for n in levels:
            for name in names if r % 2 == 0 else names[::-1]:
                results[name][n].append(await run_level(urls[name], clips, n))
                await asyncio.sleep(1.0)
        print(f"  round {r + 1}/{rounds} done (load average {os.getloadavg()[0]:.2f})", flush=True)
    return results


def merge(levels: list[dict[str, Any]]) -> dict[str, Any]:
    uploads: dict[str, list[str]] = {}
    for level in levels:
        for ref, texts in level["uploads"].items():
            uploads.setdefault(ref, []).extend(texts)
    return {
        "rows": [row for level in levels for row in level["rows"]],
        "uploads": uploads,
        "guard_redecodes": sum(level["guard_redecodes"] for level in levels),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=parse_config, action="append", help="NAME[@TREE]:KEY=VALUE,... (repeat)")
    parser.add_argument("--url", help="measure a running server instead (one configuration)")
    parser.add_argument("--sessions", default="1,4")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "eval-parity.json")
    args = parser.parse_args()
    levels = [int(v) for v in args.sessions.split(",") if v.strip()]
    configs: list[Config] = args.config or [Config("default", REPO, {})]
    clips = load_human()
    load_start = os.getloadavg()
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        if args.url:
            urls["server"] = args.url.rstrip("/")
        else:
            for config in configs:
                # The clients send audio without a pause, so the server's gap filling (for Opus DTX and
                # devices that go quiet) has nothing to fill; off, a client stalled by load on this
                # machine cannot shift the server's stream clock off the clips' offsets.
                env = dict(ASR_ONLY) | {"MEDIASERVER_STREAM_GAP_FILL_MS": "0"} | config.env
                env |= {"MEDIASERVER_MAX_SESSIONS": str(max(levels) + 8)}
                log_path = args.out.parent / f"eval-parity-{config.name}.log"
                url, _ = stack.enter_context(child_server(log_path, 180.0, env, cwd=config.tree))
                urls[config.name] = url
                print(f"  {config.name}: {url} from {config.tree} {config.env}", flush=True)
        results = asyncio.run(measure(urls, clips, levels, args.rounds))
    summaries = {name: {n: summarize(merge(results[name][n])) for n in levels} for name in urls}
    print(f"\nload average at start {load_start[0]:.2f}, at end {os.getloadavg()[0]:.2f} (1 min)")
    print(
        f"{'config':>10} {'N':>3} {'clips':>5} {'stream WER':>10} {'upload WER':>10} {'gap':>7} {'loops':>5} "
        f"{'guarded':>7} {'final p50':>9} {'final p95':>9} {'guarded ms':>10} {'other ms':>8}"
    )
    for name, by_level in summaries.items():
        for n, s in by_level.items():
            gap = s["stream_wer"] - s["upload_wer"]
            print(
                f"{name:>10} {n:>3} {s['clips']:>5} {100 * s['stream_wer']:9.2f}% {100 * s['upload_wer']:9.2f}% "
                f"{100 * gap:+6.2f} {len(s['looping_finals']):>5} {s['guarded_finals']:>7} {s['final_p50_s']:9.3f} "
                f"{s['final_p95_s']:9.3f} {s['server_latency_guarded_p50_ms'] or float('nan'):10.0f} "
                f"{s['server_latency_other_p50_ms'] or float('nan'):8.0f}"
            )
            ok = (
                gap <= TARGET_WER_GAP and not s["looping_finals"] and (n != 1 or s["final_p50_s"] <= TARGET_FINAL_P50_S)
            )
            print(
                f"{'':>14} targets: {'met' if ok else 'MISSED'}"
                + "".join(f"\n{'':>16}loop: {t!r}" for t in s["looping_finals"])
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "summaries": summaries, "results": results},
            indent=2,
            default=float,
        )
    )
    print(f"\nraw: {args.out}")


if __name__ == "__main__":
    main()
