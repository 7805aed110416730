#!/usr/bin/env python3
"""Speaker verification with the server's GE2E encoder: how often a voice is let in or kept out.

Real multi-clip speakers are scarce on the package registries. The figures rest on the suite's
real recordings (tests/human_speech.py):

* **genuine speakers** (several clips each): the LibriVox reader (5 clips, 25 s), JFK (his 11 s
  clip cut at its pauses into 3 parts: one recording, so optimistic), and the "feels like these
  days go on forever" speaker (2 clips);
* **impostors**: every other speaker's clips: the two CMU ARCTIC voices (awb, slt), the card
  commands' speaker, and Piper's voice read at three speeds (a synthetic voice, as a replayed or
  generated voice would be).

Each genuine speaker is enrolled from 1 clip and from 3 clips (all choices; as the server enrols:
the clips' embeddings weighted by their seconds of speech) and tested on their other clips
(genuine trials) and on every clip of everyone else (impostor trials). Printed: the equal error
rate (EER), and the false-accept and false-reject rates at ``--threshold`` (the server's
``speaker_threshold``) and at a few others; the cost of one embedding alone and batched, and the
encoder's memory. ``--plot`` writes the score distributions.

    python tools/bench_speakers.py [--threshold 0.75] [--plot docs/bench-speakers.png]
"""

from __future__ import annotations

import argparse
import itertools
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mediaserver.config import Settings
from mediaserver.speakers.encoder import SpeakerEncoder, voiced_seconds
from mediaserver.speakers.fetch import default_dir, fetch
from tests.human_speech import default_dir as speech_dir
from tests.human_speech import load_clips

GENUINE = {
    "reader": ["librivox_0870", "librivox_0880", "librivox_0890", "librivox_0920", "librivox_0930"],
    "forever": ["forever_2", "forever_4"],
}
JFK_CUTS_S = [(0.0, 3.2), (3.2, 6.8), (6.8, 11.0)]  # at his pauses
OTHER_REAL = ["arctic_a0007", "arctic_a0009", "cards_002", "cards_003", "cards_004", "cards_005", "goforward"]
PIPER_TEXTS = [
    "Turn on the kitchen lights and close the garage door.",
    "What is the weather like in Paris this afternoon?",
    "Please remind me to call my mother tomorrow morning.",
]


@dataclass(frozen=True)
class Voice:
    speaker: str
    name: str
    audio: np.ndarray


def voices() -> list[Voice]:
    clips = {name: audio for name, audio, _ in load_clips(speech_dir())}
    result = [Voice(speaker, name, clips[name]) for speaker, names in GENUINE.items() for name in names]
    result += [
        Voice("jfk", f"jfk_{n}", clips["jfk"][int(a * 16000) : int(b * 16000)]) for n, (a, b) in enumerate(JFK_CUTS_S)
    ]
    result += [Voice(name, name, clips[name]) for name in OTHER_REAL]
    from piper import SynthesisConfig

    from mediaserver.audio.decode import resample_mono
    from tests.conftest import _voice

    piper = _voice()
    for n, (text, speed) in enumerate(zip(PIPER_TEXTS, (0.85, 1.0, 1.2), strict=True)):
        config = SynthesisConfig(length_scale=speed)
        pcm = np.concatenate([c.audio_int16_array for c in piper.synthesize(text, syn_config=config)])
        audio = resample_mono(pcm.astype(np.float32) / 32768.0, 22050)
        result.append(Voice("piper", f"piper_{n}", audio))
    return result


def enrolment(vectors: list[np.ndarray], seconds: list[float]) -> np.ndarray:
    mean = np.mean([v * s for v, s in zip(vectors, seconds, strict=True)], axis=0)
    result: np.ndarray = mean / np.linalg.norm(mean)
    return result


def rates(genuine: np.ndarray, impostor: np.ndarray, threshold: float) -> tuple[float, float]:
    """(false accepts among impostor trials, false rejects among genuine trials) at ``threshold``."""
    return float(np.mean(impostor >= threshold)), float(np.mean(genuine < threshold))


def eer(genuine: np.ndarray, impostor: np.ndarray) -> tuple[float, float]:
    """The equal error rate and the threshold it is reached at."""
    best = (1.0, 0.0)
    for threshold in np.linspace(0.3, 1.0, 701):
        far, frr = rates(genuine, impostor, float(threshold))
        if abs(far - frr) < abs(best[0] - best[1]) or best == (1.0, 0.0):
            best = (far, frr)
            at = float(threshold)
    return (best[0] + best[1]) / 2, at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threshold", type=float, default=Settings(_env_file=None).speaker_threshold)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    encoder = SpeakerEncoder(fetch(default_dir()))
    load_s = time.perf_counter() - started
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    all_voices = voices()
    embedded: dict[str, tuple[np.ndarray, float]] = {}
    for voice in all_voices:
        embedded[voice.name] = (encoder.embed(voice.audio), voiced_seconds(voice.audio))
    speakers = {v.speaker for v in all_voices}
    print(f"{len(all_voices)} voices, {len(speakers)} speakers ({', '.join(sorted(speakers))})")

    results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for clips_per_enrolment in (1, 3):
        genuine: list[float] = []
        impostor: list[float] = []
        for speaker in sorted({"reader", "forever", "jfk"}):
            own = [v for v in all_voices if v.speaker == speaker]
            others = [v for v in all_voices if v.speaker != speaker]
            if len(own) <= clips_per_enrolment:
                continue  # nothing left to test on
            for chosen in itertools.combinations(own, clips_per_enrolment):
                model = enrolment([embedded[v.name][0] for v in chosen], [embedded[v.name][1] for v in chosen])
                genuine += [float(embedded[v.name][0] @ model) for v in own if v not in chosen]
                impostor += [float(embedded[v.name][0] @ model) for v in others]
        g, i = np.array(genuine), np.array(impostor)
        results[clips_per_enrolment] = (g, i)
        rate, at = eer(g, i)
        print(f"\nenrolled from {clips_per_enrolment} clip(s): {g.size} genuine trials, {i.size} impostor trials")
        print(
            f"  EER {rate:.1%} (at {at:.3f}); genuine min {g.min():.3f} mean {g.mean():.3f}; "
            f"impostor max {i.max():.3f} mean {i.mean():.3f}"
        )
        for threshold in sorted({args.threshold, 0.65, 0.7, 0.8, 0.85}):
            far, frr = rates(g, i, threshold)
            marker = "  <- speaker_threshold" if threshold == args.threshold else ""
            print(f"  threshold {threshold:.2f}: false accepts {far:6.1%}, false rejects {frr:6.1%}{marker}")

    # Cost: one 3 s voice alone, and eight at once (one batch), on this machine.
    three_s = next(v.audio for v in all_voices if v.name == "librivox_0880")
    alone = []
    for _ in range(5):
        started = time.perf_counter()
        encoder.embed(three_s)
        alone.append(time.perf_counter() - started)
    batched = []
    for _ in range(3):
        started = time.perf_counter()
        encoder.embed_batch([three_s] * 8)
        batched.append((time.perf_counter() - started) / 8)
    print(
        f"\ncost of a 3 s voice: {np.median(alone) * 1000:.0f} ms alone, {np.median(batched) * 1000:.0f} ms each in a "
        f"batch of 8 ({np.median(alone) / np.median(batched):.1f}x less); encoder load {load_s:.2f} s, "
        f"+{(rss_after - rss_before) / 1024:.0f} MiB RSS"
    )
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, (clips, (g, i)) in zip(axes, results.items(), strict=True):
            bins = np.linspace(0.2, 1.0, 41)
            ax.hist(i, bins=bins, alpha=0.6, label=f"impostors ({i.size})", density=True)
            ax.hist(g, bins=bins, alpha=0.6, label=f"same speaker ({g.size})", density=True)
            ax.axvline(args.threshold, color="k", linestyle="--", label=f"speaker_threshold {args.threshold:g}")
            ax.set_title(f"enrolled from {clips} clip(s): EER {eer(g, i)[0]:.1%}")
            ax.set_xlabel("cosine similarity to the enrolment")
            ax.legend()
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=90)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
