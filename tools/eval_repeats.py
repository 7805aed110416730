#!/usr/bin/env python3
"""Long uploads of repeated and of varied real speech: the server's upload path against
faster-whisper called directly.

A user trial found JFK's sentence said three times (34.5 s) coming back garbled and different on
every upload, while faster-whisper alone got it word for word. This tool decodes, in-process
through the real ``AsrService`` with the server's default settings (what ``/v1/audio/transcriptions``
with ``response_format=text`` runs after decoding the file), and through ``WhisperModel.transcribe``
(``beam_size=1, vad_filter=True``, otherwise faster-whisper's defaults):

- ``jfk3gap``: jfk.wav three times, 0.5 s of silence after each (34.5 s);
- ``jfk30``: jfk.wav thirty times, no gaps (330 s);
- ``all17x3``: the 17 clips of ``tests/human_speech.py`` one after the other with 1 s of silence
  after each, three times over (about 250 s of varied speech).

Each upload is decoded ``--runs`` times by the server; it prints WER against the references
joined, words, whether the runs agreed, and the loop-guard redecodes the engine counted.

    python tools/eval_repeats.py [--model tiny.en|base] [--runs 2] [--cases jfk3gap,jfk30,all17x3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.human_speech import default_dir, load_clips
from tests.wer import normalize, spoken_form, word_error_rate


def cases() -> dict[str, tuple[np.ndarray, str]]:
    clips = load_clips(default_dir())
    [(jfk, jfk_ref)] = [(audio, ref) for name, audio, ref in clips if name == "jfk"]

    def silence(seconds: float) -> np.ndarray:
        return np.zeros(int(seconds * 16000), np.float32)

    everything = [part for _, audio, _ in clips for part in (audio, silence(1.0))]
    return {
        "jfk3gap": (np.concatenate([jfk, silence(0.5)] * 3), " ".join([jfk_ref] * 3)),
        "jfk30": (np.concatenate([jfk] * 30), " ".join([jfk_ref] * 30)),
        "all17x3": (np.concatenate(everything * 3), " ".join([ref for _, _, ref in clips] * 3)),
    }


def score(reference: str, text: str) -> float:
    return word_error_rate(spoken_form(reference), spoken_form(text))


async def main() -> None:
    from faster_whisper import WhisperModel

    from mediaserver.asr.engine import WhisperEngine
    from mediaserver.asr.models import ModelRegistry
    from mediaserver.asr.service import AsrService
    from mediaserver.config import Settings
    from mediaserver.devices import choose_device
    from mediaserver.events import TranscriptionOptions
    from mediaserver.metrics import Metrics

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--cases", default="jfk3gap,jfk30,all17x3")
    args = parser.parse_args()

    settings = Settings(asr_preload_models=[args.model])
    service = AsrService(settings, choose_device("cpu", "auto", 0), ModelRegistry(settings), Metrics())
    await service.start()
    loaded = await service.get_model(args.model)
    engine = loaded.engine
    assert isinstance(engine, WhisperEngine)
    direct = WhisperModel(engine.model_dir, "cpu", compute_type="int8")
    options = TranscriptionOptions(with_segment_timestamps=settings.asr_upload_timestamps)  # as an upload's
    all_cases = cases()
    print(
        f"{args.model}; server: asr_window_s={settings.asr_window_s}, guards "
        f"repeat_min={settings.asr_guard_repeat_min} max_words_per_s={settings.asr_guard_max_words_per_s}"
    )
    try:
        for name in args.cases.split(","):
            audio, reference = all_cases[name]
            guards_before = sum(v for k, v in engine.counters.items() if k.startswith("guard_redecode_"))
            texts, server_s = [], 0.0
            for _ in range(args.runs):
                started = time.perf_counter()
                texts.append((await service.transcribe(audio, options, model=args.model)).text)
                server_s += time.perf_counter() - started
            guards = sum(v for k, v in engine.counters.items() if k.startswith("guard_redecode_")) - guards_before
            started = time.perf_counter()
            segments, _ = direct.transcribe(audio, language="en", beam_size=1, vad_filter=True)
            direct_text = "".join(seg.text for seg in segments)
            direct_s = time.perf_counter() - started
            agree = len({normalize(t) for t in texts}) == 1
            wers = ", ".join(f"{score(reference, t) * 100:.1f}" for t in texts)
            print(
                f"{name:8s} {audio.size / 16000:6.1f} s, {len(normalize(reference).split())} words: "
                f"server WER {wers} % ({', '.join(str(len(normalize(t).split())) for t in texts)} words, "
                f"runs agree: {agree}, guard redecodes {guards}, {server_s / args.runs:.1f} s/run); "
                f"direct WER {score(reference, direct_text) * 100:.1f} % "
                f"({len(normalize(direct_text).split())} words, {direct_s:.1f} s)"
            )
            for run, text in enumerate(texts):
                if score(reference, text) > score(reference, direct_text) + 0.02:
                    print(f"  run {run}: {text[:600]}")
    finally:
        await service.aclose()


if __name__ == "__main__":
    asyncio.run(main())
