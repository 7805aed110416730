#!/usr/bin/env python3
"""Encoder window length against accuracy and engine time: is a short window as good as 30 s?

Whisper was trained on 30 s windows; CTranslate2 also encodes shorter inputs, which costs less in
proportion. This tool decodes the same utterances through the real engine (in-process, packing
off, batches of ``--batch``) with each ``--windows`` value as the shortest window a job may use
(``AsrJob.min_window_s``: what ``asr_window_s`` and ``asr_partial_window_s`` set; the window
doubles while the speech does not fit), alternating the order over two passes so other load on
the machine falls on each alike. The utterances: the 64-sentence Piper corpus, the repository's
audio fixtures, and pairs of consecutive ones joined by 0.4 s of silence (longer utterances).

It prints, per window, WER (jiwer after lower-casing and removing punctuation; single utterances
and pairs apart), how many transcripts differ from the 30 s one, how many short-window decodes
were redone on 30 s, and engine throughput (audio s per wall s); then every differing transcript.

    python tools/eval_windows.py [--model tiny.en|base] [--windows 30,20,15,10] [--batch 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from speech_corpus import fixtures, synthesize

from tests.wer import normalize


def main() -> None:
    import jiwer

    from mediaserver.asr.engine import AsrJob, WhisperEngine
    from mediaserver.asr.models import assemble_base_model, bundled_tiny_en_dir
    from mediaserver.asr.windows import WINDOW_S, PackingConfig
    from mediaserver.config import Settings
    from mediaserver.events import Transcript, TranscriptionOptions

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    parser.add_argument("--windows", default="30,20,15,10", help="shortest windows to compare, seconds")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    windows = [float(w) for w in args.windows.split(",") if w.strip()]
    if WINDOW_S not in windows:
        windows.insert(0, WINDOW_S)

    settings = Settings()
    model_dir = str(
        bundled_tiny_en_dir()
        if args.model == "tiny.en"
        else assemble_base_model(settings.model_cache_dir, progress=False)
    )
    singles = synthesize() + fixtures()
    gap = np.zeros(int(0.4 * 16000), np.float32)
    pairs = [
        (np.concatenate([a.audio, gap, b.audio]), f"{a.text} {b.text}")
        for a, b in zip(singles[0::2], singles[1::2], strict=False)
    ]
    items = [(u.audio, u.text) for u in singles] + pairs
    audio_s = sum(a.size for a, _ in items) / 16000
    lengths = [a.size / 16000 for a, _ in items]
    print(f"{args.model}: {len(items)} utterances, {audio_s:.0f} s ({min(lengths):.1f}-{max(lengths):.1f} s each)")

    engine = WhisperEngine(args.model, model_dir, cpu_threads=os.cpu_count() or 1, packing=PackingConfig(enabled=False))
    options = TranscriptionOptions(language="en", with_segment_timestamps=False)
    engine.transcribe_batch([AsrJob(items[0][0], options)])  # warm-up

    wall = dict.fromkeys(windows, 0.0)
    texts: dict[float, list[str]] = {}
    retries = dict.fromkeys(windows, 0)
    for order in (windows, windows[::-1]):
        for window in order:
            before = engine.counters["short_window_retries"]
            started = time.perf_counter()
            out: list[str] = []
            for i in range(0, len(items), args.batch):
                jobs = [AsrJob(a, options, min_window_s=window) for a, _ in items[i : i + args.batch]]
                out += [r.text if isinstance(r, Transcript) else "" for r in engine.transcribe_batch(jobs)]
            wall[window] += time.perf_counter() - started
            retries[window] += engine.counters["short_window_retries"] - before
            texts[window] = out

    refs = [normalize(t) for _, t in items]
    full = [normalize(t) for t in texts[WINDOW_S]]
    n = len(singles)
    for window in windows:
        hyps = [normalize(t) for t in texts[window]]
        changed = sum(a != b for a, b in zip(hyps, full, strict=True))
        print(
            f"window {window:4g} s: WER {jiwer.wer(refs, hyps) * 100:5.2f} % "
            f"(single {jiwer.wer(refs[:n], hyps[:n]) * 100:.2f}, pairs {jiwer.wer(refs[n:], hyps[n:]) * 100:.2f}); "
            f"differ from 30 s {changed}/{len(hyps)}; redone on 30 s {retries[window] // 2}; "
            f"{2 * audio_s / wall[window]:.1f} audio s/s"
        )
    for window in windows:
        for ref, a, b in zip(refs, full, (normalize(t) for t in texts[window]), strict=True):
            if window != WINDOW_S and a != b:
                print(f"  [{window:g}] ref: {ref}\n        30: {a}\n  {window:8g}: {b}")


if __name__ == "__main__":
    main()
