#!/usr/bin/env python3
"""End of turn on Piper's and real people's speech: silence detection against the turn model and the rule.

The utterances (tools/turn_cases.py): whole sentences, Piper's and the suite's real recordings, and
the same sentences paused mid-way for 0.4, 0.7, 1.0 and 1.2 s. Each goes, in stream time, through
the server's ``VadSegmenter`` with the eagerness-medium cap (4 s) as its hangover, and a **trace**
is taken of each pause, as ``StreamSession`` sees it (not the pause after a burst shorter than
``stream_min_speech_ms``: the server does not judge it, and speech resuming joins the two):

* the final's words, decoded by the server's own ASR service (tiny.en, as a final) from the audio
  at ``turn_final_silence_ms`` (30) into the pause, and how long that decode took;
* the turn model's score (Smart Turn v3.2 on onnxruntime, the server's ``TurnModel``) at
  ``turn_candidate_silence_ms`` (200) and every ``turn_rescore_ms`` (300) more of silence, and how
  long each took.

Every policy is then judged on the same traces (a decision arrives its measured time after it was
asked; it ends the turn only if the pause still goes on):

* **silence-300 / silence-500**: the segmenter with that hangover (run separately);
* **model**: a score >= ``turn_threshold`` at the first check, >= ``turn_rescore_threshold`` at a
  rescore, else the cap;
* **model+words**: the same, vetoed when the words end on ``turn_unfinished_words`` (the server's
  rule before issue #33);
* **rule**: the server's rule (mediaserver/turns/decision.py), with the settings in force;
* **rule+text** (with ``--text-eou``): the rule, and the words' end-of-utterance probability read
  from the bundled SmolLM2-135M-Instruct (tools/text_eou.py, LiveKit's way): words it scores below
  ``--text-threshold`` veto the model and the finished words (rules 2 and 3), and that pause ends
  at ``--text-hold-ms`` of silence (0: the cap). The model's decision then waits for the text score
  too (the words' decode + the measured scoring time).

Reported per source (Piper, real) and policy: for whole sentences the turn end after the last
word, p50 / p95 / max, the turns the cap ended and the whole sentences cut at their own pauses;
for paused sentences the cut-offs at each pause length.

    python tools/bench_turns.py [--plot docs/bench-turns.png] [--json out.json] [-v]
    python tools/bench_turns.py --traces FILE --text-eou punct --text-threshold 0.02 --text-hold-ms 1000

Targets (issue #33): whole sentences, real and Piper: p50 <= 0.35 s, p95 <= 0.7 s, max <= 1.0 s;
0.7 s mid-sentence pauses, real and Piper: cut-offs <= half of silence-500's.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, percentile
from turn_cases import PAUSES_S, Case, piper_cases, real_cases, whisper_model

sys.path.insert(0, str(REPO))

from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.service import AsrService
from mediaserver.audio.segmenter import SegmenterConfig, Utterance, VadSegmenter
from mediaserver.config import Settings
from mediaserver.devices import choose_device
from mediaserver.events import SAMPLE_RATE_HZ, Priority, TranscriptionOptions
from mediaserver.metrics import Metrics
from mediaserver.turns.decision import TurnRule, Words, text_skipped
from mediaserver.turns.fetch import default_dir, fetch
from mediaserver.turns.model import TurnModel
from mediaserver.turns.words import ends_unfinished

POLICIES = ("silence-300", "silence-500", "model", "model+words", "rule")
FRAME_MS = 30


@dataclass
class Check:
    silence_ms: int
    probability: float
    decision_ms: float


@dataclass
class Pause:
    start_ms: int  # stream time the silence began
    length_ms: int  # how long it lasted (to the speech resuming, or the cap)
    words: str = ""
    words_ready_ms: float = 0.0  # into the pause: turn_final_silence_ms + the decode
    checks: list[Check] = field(default_factory=list)


@dataclass
class Result:
    policy: str
    source: str
    text: str
    pause_ms: int  # the inserted pause (0: a whole sentence)
    cut_off: bool  # the turn ended before the last word
    delay_ms: float | None  # last word -> turn ended (None if cut off)
    by_cap: bool = False
    evidence: str = ""


class Tracer:
    """Traces the pauses of a case, caching the decodes and scores of audio already seen (the
    paused cases share their first part)."""

    def __init__(self, model: TurnModel, settings: Settings) -> None:
        self.model, self.settings = model, settings
        self._cache: dict[tuple[str, str], tuple[Any, float]] = {}
        # The words are decoded as the server decodes a pause's final: its own ASR service (the
        # bundled tiny.en, batched engine, shortened encoder windows), as a final's priority.
        self._loop = asyncio.new_event_loop()
        self._asr = AsrService(settings, choose_device("cpu", "auto", 0), ModelRegistry(settings), Metrics())
        self._loop.run_until_complete(self._asr.start())
        self._options = TranscriptionOptions(language="en", with_segment_timestamps=False)

    def close(self) -> None:
        self._loop.run_until_complete(self._asr.aclose())
        self._loop.close()

    def _cached(self, kind: str, audio: np.ndarray, compute: Callable[[], Any]) -> tuple[Any, float]:
        key = (kind, hashlib.sha1(audio.tobytes()).hexdigest())
        if key not in self._cache:
            began = time.perf_counter()
            value = compute()
            self._cache[key] = (value, (time.perf_counter() - began) * 1000.0)
        return self._cache[key]

    def words(self, audio: np.ndarray) -> tuple[str, float]:
        def decode() -> str:
            job = self._asr.transcribe(audio, self._options, priority=Priority.FINAL)
            return self._loop.run_until_complete(job).text

        text, ms = self._cached("words", audio, decode)
        return str(text), ms

    def score(self, audio: np.ndarray) -> tuple[float, float]:
        probability, ms = self._cached("score", audio, lambda: self.model.score_now([audio])[0].probability)
        return float(probability), ms

    def trace(self, case: Case) -> tuple[list[Pause], int | None]:
        """The pauses of the case's first turn, and where the cap ends it (None: it never does)."""
        s = self.settings
        segmenter = VadSegmenter(segmenter_config(s, s.turn_wait_medium_ms))
        frame = SAMPLE_RATE_HZ * segmenter.config.frame_ms // 1000
        pauses: list[Pause] = []
        final_ms = s.turn_final_silence_ms or s.turn_candidate_silence_ms
        words_audio = np.zeros(0, np.float32)
        for start in range(0, case.audio.size, frame):
            events = segmenter.push(case.audio[start : start + frame])
            for event in events:
                if isinstance(event, Utterance):
                    if pauses:
                        pauses[-1].length_ms = event.end_ms - pauses[-1].start_ms
                    return pauses, event.end_ms
            if not segmenter.long_enough or segmenter.silence_ms == 0:
                continue  # a burst too short to keep is no turn: its pause is not judged (turns/decision.py)
            silence_ms, begun = segmenter.silence_ms, segmenter.position_ms - segmenter.silence_ms
            if not pauses or pauses[-1].start_ms != begun:
                pauses.append(Pause(begun, 0))
            pause = pauses[-1]
            pause.length_ms = silence_ms
            if silence_ms >= final_ms and pause.words_ready_ms == 0.0:
                words_audio = segmenter.current_audio()  # decoded once the pause is judged (most are not)
                pause.words_ready_ms = -1.0
            if silence_ms >= s.turn_candidate_silence_ms and pause.words_ready_ms < 0:
                pause.words, decode_ms = self.words(words_audio)
                pause.words_ready_ms = final_ms + decode_ms
            due = s.turn_candidate_silence_ms + len(pause.checks) * max(1, s.turn_rescore_ms)
            if silence_ms >= due and (not pause.checks or s.turn_rescore_ms > 0):
                probability, decision_ms = self.score(segmenter.current_audio())
                pause.checks.append(Check(silence_ms, probability, decision_ms))
        return pauses, None


def segmenter_config(settings: Settings, hangover_ms: int) -> SegmenterConfig:
    return SegmenterConfig(
        aggressiveness=settings.stream_vad_aggressiveness,
        hangover_ms=hangover_ms,
        preroll_ms=settings.stream_vad_preroll_ms,
        min_speech_ms=settings.stream_min_speech_ms,
        max_utterance_s=settings.stream_max_utterance_s,
    )


def silence_end(case: Case, settings: Settings, hangover_ms: int) -> int:
    segmenter = VadSegmenter(segmenter_config(settings, hangover_ms))
    frame = SAMPLE_RATE_HZ * segmenter.config.frame_ms // 1000
    for start in range(0, case.audio.size, frame):
        for event in segmenter.push(case.audio[start : start + frame]):
            if isinstance(event, Utterance):
                return event.end_ms
    raise RuntimeError(f"{case.text!r}: no end of turn")


def _frame_up(ms: float) -> int:
    """Decisions act on the next audio frame the session receives."""
    return int(-(-ms // FRAME_MS) * FRAME_MS)


@dataclass
class TextJudge:
    """The text end-of-utterance score of each pause's words (``--text-eou``), and how it is used."""

    variant: str
    threshold: float  # a score below it vetoes the model and the finished words
    hold_ms: int  # a vetoed pause ends at this silence (0: the cap)
    scores: dict[str, tuple[float, float]]  # words -> (probability, scoring ms)
    skip_endings: tuple[str, ...] = ()  # words ending on one of these are not scored (turn_text_skip_endings)

    def of(self, pause: Pause) -> tuple[bool, float | None, float]:
        """(veto, probability or None (not scored), into the pause when the score is known)."""
        if text_skipped(pause.words, self.skip_endings):
            return False, None, pause.words_ready_ms
        probability, ms = self.scores[pause.words]
        return probability < self.threshold, probability, pause.words_ready_ms + ms


def text_scores(traced: list[Traced], variant: str) -> dict[str, tuple[float, float]]:
    """Every traced pause's words scored by the bundled SmolLM2 (a llama-server child), with the time
    each scoring took (scored once more when cached by the prompt: the first call of a prompt counts)."""
    from text_eou import TextEou

    eou = TextEou()
    scores: dict[str, tuple[float, float]] = {}
    try:
        eou.probability("Hello there.", variant)  # warm up
        for _, pauses, _ in traced:
            for pause in pauses:
                if pause.words_ready_ms and pause.words not in scores:
                    began = time.perf_counter()
                    probability = eou.probability(pause.words, variant)
                    scores[pause.words] = (probability, (time.perf_counter() - began) * 1000.0)
    finally:
        eou.close()
    return scores


def pause_end(
    policy: str, pause: Pause, rule: TurnRule, settings: Settings, text: TextJudge | None = None
) -> tuple[int, str] | None:
    """Into the pause, where ``policy`` ends the turn (and why), or None if it does not."""
    words_class = rule.words(pause.words) if pause.words_ready_ms else Words.UNKNOWN
    ends: list[tuple[int, str]] = []
    veto, text_ready = False, 0.0
    text_probability: float | None = None
    if policy == "rule+text":
        assert text is not None
        if not pause.words_ready_ms:
            return None  # no words, no check
        veto, text_probability, text_ready = text.of(pause)
        if veto and text.hold_ms > 0:
            held = f"text {text_probability or 0.0:.3f} held {text.hold_ms}"
            ends.append((_frame_up(max(text.hold_ms, text_ready)), held))
    for n, check in enumerate(pause.checks):
        arrives = check.silence_ms + check.decision_ms
        if policy == "model":
            finished = rule.model_ends(check.probability, Words.OPEN, first=n == 0)
        elif policy == "model+words":
            finished = rule.model_ends(check.probability, Words.OPEN, first=n == 0) and not ends_unfinished(
                pause.words, settings.turn_unfinished_words
            )
            arrives = max(arrives, pause.words_ready_ms)  # the server waits for the words
        else:
            arrives = max(arrives, pause.words_ready_ms, text_ready, rule.model_end_silence_ms(words_class))
            finished = not veto and rule.model_ends(check.probability, words_class, first=n == 0)
        if finished:
            ends.append((_frame_up(arrives), f"model {check.probability:.2f} at {check.silence_ms}"))
            break
    if policy in ("rule", "rule+text") and not veto:
        at = rule.silence_ends_ms(
            words_class, model_failed=False, text=text_probability if policy == "rule+text" else None
        )
        if at is not None:
            ends.append((_frame_up(max(at, pause.words_ready_ms, text_ready)), f"words at {at}"))
    ends = [e for e in ends if e[0] < pause.length_ms]
    return min(ends) if ends else None


def judge(
    policy: str,
    case: Case,
    traced: tuple[list[Pause], int | None],
    rule: TurnRule,
    s: Settings,
    text: TextJudge | None = None,
) -> Result:
    pauses, cap_end = traced
    ended: int | None = None
    by_cap, evidence = False, ""
    if policy.startswith("silence-"):
        ended = silence_end(case, s, int(policy.split("-")[1]))
    else:
        for pause in pauses:
            found = pause_end(policy, pause, rule, s, text)
            if found is not None:
                ended, evidence = pause.start_ms + found[0], f"{found[1]} | {pause.words}"
                break
        if ended is None:
            if cap_end is None:
                raise RuntimeError(f"{case.text!r}: no end of turn")
            ended, by_cap, evidence = cap_end, True, f"cap | {pauses[-1].words if pauses else ''}"
    cut = ended < case.speech_end_ms
    delay = None if cut else float(ended - case.speech_end_ms)
    return Result(policy, case.source, case.text, case.pause_ms, cut, delay, by_cap, evidence)


Traced = tuple[Case, list[Pause], int | None]


def trace_all(settings: Settings, sources: tuple[str, ...], threads: int) -> tuple[list[Traced], list[float]]:
    """Every case's trace, and the measured decision times (the slow part: decodes and scores)."""
    model = TurnModel(fetch(default_dir()), threads=threads)
    model.score_now([np.zeros(SAMPLE_RATE_HZ, np.float32)])  # warm up
    whisper = whisper_model()
    made: list[Case] = []
    if "piper" in sources:
        made += piper_cases()
    if "real" in sources:
        made += real_cases(whisper)
    tracer = Tracer(model, settings)
    traced: list[Traced] = []
    try:
        for n, case in enumerate(made, 1):
            traced.append((case, *tracer.trace(case)))
            if n % 25 == 0:
                print(f"traced {n}/{len(made)} cases", file=sys.stderr, flush=True)
    finally:
        tracer.close()
    decisions = [ms for (kind, _), (_, ms) in tracer._cache.items() if kind == "score"]
    return traced, decisions


def judge_all(traced: list[Traced], settings: Settings, text: TextJudge | None = None) -> list[Result]:
    rule = TurnRule.of(settings)
    return [
        judge(policy, case, (pauses, cap), rule, settings, text)
        for case, pauses, cap in traced
        for policy in policies(text)
    ]


def policies(text: TextJudge | None) -> tuple[str, ...]:
    return (*POLICIES, "rule+text") if text is not None else POLICIES


def summarize(results: list[Result]) -> dict[str, dict[str, dict[str, float]]]:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for source in sorted({r.source for r in results}):
        for policy in dict.fromkeys(r.policy for r in results):
            mine = [r for r in results if r.policy == policy and r.source == source]
            whole = [r for r in mine if r.pause_ms == 0]
            delays = [r.delay_ms for r in whole if r.delay_ms is not None]
            row: dict[str, float] = {
                "whole": float(len(whole)),
                "p50_ms": percentile(delays, 50),
                "p95_ms": percentile(delays, 95),
                "max_ms": max(delays, default=float("nan")),
                "by_cap": float(sum(r.by_cap for r in whole)),
                "whole_cut": float(sum(r.cut_off for r in whole)),
            }
            # The paused sentences not cut: their turn end after the last word (after the pause).
            kept = [r for r in mine if r.pause_ms and r.delay_ms is not None]
            kept_delays = [r.delay_ms for r in kept if r.delay_ms is not None]
            row["paused_p95_ms"] = percentile(kept_delays, 95)
            row["paused_max_ms"] = max(kept_delays, default=float("nan"))
            row["paused_by_cap"] = float(sum(r.by_cap for r in kept))
            for pause_s in PAUSES_S:
                paused = [r for r in mine if r.pause_ms == int(pause_s * 1000)]
                row[f"cut_{pause_s}"] = sum(r.cut_off for r in paused) / max(1, len(paused))
                row[f"n_{pause_s}"] = float(len(paused))
            table.setdefault(source, {})[policy] = row
    return table


def print_table(table: dict[str, dict[str, dict[str, float]]]) -> None:
    pauses = " ".join(f"{f'cut@{p}s':>8s}" for p in PAUSES_S)
    for source, rows in table.items():
        first = next(iter(rows.values()))
        paused_n = int(sum(first[f"n_{p}"] for p in PAUSES_S) / len(PAUSES_S))
        print(f"\n{source}: {int(first['whole'])} whole sentences, {paused_n} paused sentences at each pause")
        print(
            f"{'policy':12s} {'p50':>6s} {'p95':>6s} {'max':>6s} {'cap':>4s} {'cut':>4s} {pauses}"
            f" | paused, not cut: {'p95':>5s} {'max':>5s} {'cap':>4s}"
        )
        for policy, row in rows.items():
            cuts = " ".join(f"{100 * row[f'cut_{p}']:7.0f}%" for p in PAUSES_S)
            print(
                f"{policy:12s} {row['p50_ms'] / 1000:6.2f} {row['p95_ms'] / 1000:6.2f} {row['max_ms'] / 1000:6.2f} "
                f"{row['by_cap']:4.0f} {row['whole_cut']:4.0f} {cuts}"
                f" | {'':16s} {row['paused_p95_ms'] / 1000:5.2f} {row['paused_max_ms'] / 1000:5.2f} "
                f"{row['paused_by_cap']:4.0f}"
            )


def plot(results: list[Result], table: dict[str, dict[str, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = list(table)
    shown = list(next(iter(table.values())))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    left, right = axes
    positions, data, labels = [], [], []
    for i, policy in enumerate(shown):
        for j, source in enumerate(sources):
            delays = [
                r.delay_ms / 1000
                for r in results
                if r.policy == policy and r.source == source and r.pause_ms == 0 and r.delay_ms is not None
            ]
            positions.append(i * (len(sources) + 1) + j)
            data.append(delays)
            labels.append(f"{policy}\n{source}")
    left.boxplot(data, positions=positions, tick_labels=labels, showfliers=True)
    left.axhline(1.0, color="#c66", linestyle=":", label="max target 1.0 s")
    left.axhline(0.35, color="#6a6", linestyle=":", label="p50 target 0.35 s")
    left.set_ylabel("last word → turn ended (s)")
    left.set_title("Whole sentences: turn-end delay")
    left.tick_params(axis="x", labelsize=7)
    left.legend(fontsize=7)
    left.grid(axis="y", alpha=0.3)
    width = 0.8 / len(sources)
    for j, source in enumerate(sources):
        shares = [100 * table[source][p]["cut_0.7"] for p in shown]
        bars = right.bar([i + j * width for i in range(len(shown))], shares, width, label=source)
        right.bar_label(bars, fmt="%.0f%%", fontsize=7)
    right.set_xticks([i + width * (len(sources) - 1) / 2 for i in range(len(shown))], shown)
    right.set_ylabel("cut off at a 0.7 s mid-sentence pause (%)")
    right.set_title("Paused sentences: premature cut-offs at 0.7 s")
    right.set_ylim(0, 110)
    right.legend()
    fig.suptitle("End of turn: silence detection vs the turn model vs the rule (Piper and real speech)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads (turn_threads)")
    parser.add_argument("--sources", default="piper,real", help="piper, real or both (default)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a turn setting for this run (e.g. turn_finished_silence_ms=800); repeatable",
    )
    parser.add_argument(
        "--traces",
        type=Path,
        default=None,
        help="keep the traces in this file, and judge a later run on them (the rule's settings may change; "
        "turn_candidate_silence_ms, turn_rescore_ms and turn_final_silence_ms must not)",
    )
    parser.add_argument(
        "--text-eou",
        choices=("asr", "bare", "livekit", "punct"),
        default=None,
        help="add the rule+text policy: the words' end-of-utterance probability from the bundled SmolLM2 "
        "(tools/text_eou.py; asr: the words as decoded, punct: P(a final mark) after the bare words)",
    )
    parser.add_argument(
        "--text-threshold",
        type=float,
        default=None,
        help="a text score below it vetoes the turn's end (default: turn_text_threshold)",
    )
    parser.add_argument(
        "--text-hold-ms",
        type=int,
        default=None,
        help="a vetoed pause ends at this silence, 0: the cap (default: turn_text_hold_ms)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG here")
    parser.add_argument("--json", type=Path, default=None, help="write every result here")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per case and policy")
    args = parser.parse_args()
    values: dict[str, Any] = {}
    for item in args.set:
        name, _, raw = item.partition("=")
        try:
            values[name] = json.loads(raw)  # numbers, lists
        except json.JSONDecodeError:
            values[name] = raw
    settings = Settings(_env_file=None, **values)
    if args.traces is not None and args.traces.is_file():
        traced, decisions = pickle.loads(args.traces.read_bytes())
    else:
        traced, decisions = trace_all(settings, tuple(args.sources.split(",")), args.threads)
        if args.traces is not None:
            args.traces.write_bytes(pickle.dumps((traced, decisions)))
    text = None
    if args.text_eou is not None:
        scores = text_scores(traced, args.text_eou)
        threshold = settings.turn_text_threshold if args.text_threshold is None else args.text_threshold
        hold_ms = settings.turn_text_hold_ms if args.text_hold_ms is None else args.text_hold_ms
        text = TextJudge(args.text_eou, threshold, hold_ms, scores, tuple(settings.turn_text_skip_endings))
        times = [ms for _, ms in scores.values()]
        print(
            f"text EOU ({args.text_eou}, SmolLM2-135M Q4_1, llama-server 1 thread): {len(times)} word strings, "
            f"median {percentile(times, 50):.0f} ms, p95 {percentile(times, 95):.0f} ms"
        )
    results = judge_all(traced, settings, text)
    if args.verbose:
        for r in results:
            outcome = "CUT" if r.cut_off else f"{r.delay_ms:5.0f} ms" + (" cap" if r.by_cap else "")
            print(f"{r.source:5s} {r.policy:12s} {r.pause_ms:5d} {outcome:12s} {r.text[:70]:70s} {r.evidence}")
    print(
        f"turn model decision (features + inference, 1 window, {args.threads} thread(s)): "
        f"median {percentile(decisions, 50):.0f} ms, p95 {percentile(decisions, 95):.0f} ms"
    )
    table = summarize(results)
    print_table(table)
    if args.plot is not None:
        plot(results, table, args.plot)
        print(f"plot: {args.plot}")
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": table, "results": [asdict(r) for r in results]}, indent=1))


if __name__ == "__main__":
    main()
