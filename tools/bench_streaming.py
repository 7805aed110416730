#!/usr/bin/env python3
"""Partial cadence and final latency of live streams over the device WebSocket, side by side.

Each configuration is a child server (``python -m mediaserver`` with its own ``MEDIASERVER_*``
variables, optionally from another source tree such as an unpacked older commit); all of them run
at once and are measured in alternation, round by round, on the same clips, so that the load of
other work on the machine falls on every configuration alike.

For each ``--sessions`` level N, N clients open ``/api/ws/asr`` (server VAD, partials on) and stream
Piper sentences in real time (20 ms frames on an absolute schedule) separated by silence; session i
starts i·0.37 s after the first, so sessions overlap without speaking in lockstep. The speech
onset and end of each clip are known in stream time (first and last 10 ms frame above -40 dBFS),
so their wall times are too. Per spoken clip:

- **first words shown**: arrival of the first ``partial`` message with any text (promised
  ``delta`` or, the clients ask for ``unstable``, the latest guess) minus the speech onset; and
  **first promised**: of the first with a non-empty ``delta`` (an older server, which knows no
  ``unstable``, sends only those, so both are the same there);
- **partial interval**: time between consecutive ``partial`` messages of the clip (each changes
  what is shown), and the longest gap while someone speaks (onset → first partial, between
  partials, last partial → end of speech);
- **final latency**: arrival of ``final`` minus arrival of ``speech_stopped``;
- the final's WER against the sentence, and whether the final extends the partials (append-only).

It prints medians and p95 per configuration and level with ratios to the first configuration,
checks the targets of issue #15 (first words shown ≤ 0.8 s, interval ≤ 0.7 s, final ≤ 0.4 s p50 and
≤ 0.6 s p95), and writes a PNG of when partials arrive against the speech timeline, plus JSON.

    python tools/bench_streaming.py                                   # today's defaults alone
    python tools/bench_streaming.py --config new: --config old@/tmp/ms-main:
    python tools/bench_streaming.py --config a:STREAM_PARTIAL_INTERVAL_MS=600 \
        --config b:STREAM_PARTIAL_INTERVAL_MS=300 --sessions 1,4 --rounds 3

``--config NAME[@TREE]:KEY=VALUE,...``: KEY is a setting (``MEDIASERVER_`` is prepended), TREE a
source tree to run the server from (default: this repository). Every child gets
``MEDIASERVER_LLM_ENABLED=false`` and ``MEDIASERVER_TTS_ENABLED=false`` unless ``--full-server``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, child_server, median, percentile

sys.path.insert(0, str(REPO))

RATE = 16000
FRAME_S = 0.02
LEAD_SILENCE_S = 0.6
TAIL_SILENCE_S = 1.6
STAGGER_S = 0.37
TARGETS = {"first_partial_s": 0.8, "interval_s": 0.7, "final_p50_s": 0.4, "final_p95_s": 0.6}
ASR_ONLY = {"MEDIASERVER_LLM_ENABLED": "false", "MEDIASERVER_TTS_ENABLED": "false"}


@dataclass(frozen=True)
class Config:
    name: str
    tree: Path
    env: dict[str, str]


def parse_config(text: str) -> Config:
    head, _, settings = text.partition(":")
    name, _, tree = head.partition("@")
    env: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in settings.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE in {text!r}")
        env[f"MEDIASERVER_{key.upper()}"] = value
    return Config(name or "default", Path(tree) if tree else REPO, env)


@dataclass(frozen=True)
class Clip:
    text: str
    audio: np.ndarray  # 16 kHz float32
    onset_s: float  # first frame above the threshold, in clip time
    end_s: float  # last frame above it


def load_clips() -> list[Clip]:
    from bench_asr_clips import SENTENCES
    from speech_corpus import synthesize

    clips = []
    for utterance in synthesize(SENTENCES):
        frames = utterance.audio[: utterance.audio.size // 160 * 160].reshape(-1, 160)
        loud = np.flatnonzero(np.sqrt((frames**2).mean(axis=1)) > 0.01)
        clips.append(Clip(utterance.text, utterance.audio, loud[0] * 0.01, (loud[-1] + 1) * 0.01))
    return clips


@dataclass
class Spoken:
    """One clip as a session spoke it, and what came back for it."""

    text: str
    onset_at: float  # wall time (monotonic) of the speech onset
    end_at: float  # of the end of speech
    partials: list[tuple[float, str, str]] = field(default_factory=list)  # (arrival, delta, unstable)
    stops: list[float] = field(default_factory=list)  # arrivals of speech_stopped
    finals: list[tuple[float, str, str]] = field(default_factory=list)  # (arrival, text, delta)
    guards: list[str | None] = field(default_factory=list)  # each final's loop guard, if one fired
    latencies_ms: list[float] = field(default_factory=list)  # each final's server-side latency_ms

    def metrics(self) -> dict[str, Any]:
        arrivals = [t for t, delta, unstable in self.partials if delta or unstable]
        promised = [t for t, delta, _ in self.partials if delta]
        intervals = list(np.diff(arrivals)) if len(arrivals) > 1 else []
        spoken = [t for t in arrivals if t <= self.end_at]
        marks = [self.onset_at, *spoken, self.end_at]
        streamed = "".join(d for _, d, _ in self.partials)
        final_text = " ".join(text.strip() for _, text, _ in self.finals).strip()
        return {
            "text": self.text,
            "speech_s": self.end_at - self.onset_at,
            "first_partial_s": arrivals[0] - self.onset_at if arrivals else None,
            "first_promised_s": promised[0] - self.onset_at if promised else None,
            "partials": len(arrivals),
            "intervals_s": [float(i) for i in intervals],
            "max_gap_while_speaking_s": float(max(np.diff(marks))) if len(marks) > 1 else None,
            "final_latency_s": [f[0] - s for f, s in zip(self.finals, self.stops, strict=False)],
            "final": final_text,
            "append_only": not self.finals or self.finals[0][1].strip().startswith(streamed.strip()),
            "arrivals_rel_s": [t - self.onset_at for t in arrivals],
            "end_rel_s": self.end_at - self.onset_at,
            "stops_rel_s": [t - self.onset_at for t in self.stops],
            "finals_rel_s": [t - self.onset_at for t, _, _ in self.finals],
            "guards": list(self.guards),
            "server_latency_ms": list(self.latencies_ms),
        }


async def stream_session(url: str, clips: Sequence[Clip], delay_s: float) -> list[Spoken]:
    """One device-WebSocket session speaking ``clips`` in real time; returns what came back per clip."""
    import aiohttp

    await asyncio.sleep(delay_s)
    lead = np.zeros(int(LEAD_SILENCE_S * RATE), np.float32)
    tail = np.zeros(int(TAIL_SILENCE_S * RATE), np.float32)
    parts: list[np.ndarray] = []
    offsets: list[float] = []
    position = 0
    for clip in clips:
        parts += [lead, clip.audio, tail]
        offsets.append((position + lead.size) / RATE)
        position += lead.size + clip.audio.size + tail.size
    pcm = (np.clip(np.concatenate(parts), -1, 1) * 32767).astype("<i2").tobytes()
    frame_bytes = int(FRAME_S * RATE) * 2
    spoken: list[Spoken] = []
    current: list[Spoken | None] = [None]
    final_queue: list[Spoken] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{url.replace('http', 'ws', 1)}/api/ws/asr") as ws:
        start = {"type": "start", "mode": "server_vad", "partials": True, "unstable": True, "language": "en"}
        await ws.send_json(start)
        ready = await ws.receive_json(timeout=30)
        assert ready["type"] == "ready", ready
        done = asyncio.Event()
        expected_finals = len(clips)

        async def read() -> None:
            finals = 0
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                now = time.monotonic()
                event = json.loads(message.data)
                kind = event["type"]
                if kind == "speech_started":
                    start_s = event["audio_start_ms"] / 1000.0
                    index = max(0, int(np.searchsorted(offsets, start_s + 0.35)) - 1)
                    current[0] = spoken[min(index, len(spoken) - 1)]
                elif kind == "partial" and current[0] is not None:
                    current[0].partials.append((now, event["delta"], event.get("unstable", "")))
                elif kind == "speech_stopped" and current[0] is not None:
                    if not event["discarded"]:
                        current[0].stops.append(now)
                        final_queue.append(current[0])
                    current[0] = None
                elif kind == "final" and final_queue:
                    owner = final_queue.pop(0)
                    owner.finals.append((now, event["text"], event["delta"]))
                    owner.guards.append(event.get("guard"))
                    owner.latencies_ms.append(float(event.get("latency_ms", "nan")))
                    finals += 1
                    if finals >= expected_finals and not final_queue:
                        done.set()
                elif kind == "error":
                    print(f"  server error: {event}", file=sys.stderr)

        reader = asyncio.get_running_loop().create_task(read())
        started = time.monotonic()
        spoken = [
            Spoken(clip.text, started + offset + clip.onset_s, started + offset + clip.end_s)
            for clip, offset in zip(clips, offsets, strict=True)
        ]
        for i, offset in enumerate(range(0, len(pcm), frame_bytes)):
            delay = started + (i + 1) * FRAME_S - time.monotonic()  # a frame leaves once it is "recorded"
            if delay > 0:
                await asyncio.sleep(delay)
            await ws.send_bytes(pcm[offset : offset + frame_bytes])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 30)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    return spoken


async def run_level(url: str, clips: Sequence[Clip], sessions: int, per_session: int, round_index: int) -> list[Spoken]:
    def pick(session: int, k: int) -> Clip:
        return clips[(round_index * 7 + session + k * sessions) % len(clips)]

    results = await asyncio.gather(
        *(stream_session(url, [pick(s, k) for k in range(per_session)], s * STAGGER_S) for s in range(sessions))
    )
    return [spoken for session in results for spoken in session]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from bench_asr_clips import aggregate_wer

    firsts = [r["first_partial_s"] for r in rows if r["first_partial_s"] is not None]
    promised = [r["first_promised_s"] for r in rows if r.get("first_promised_s") is not None]
    intervals = [i for r in rows for i in r["intervals_s"]]
    gaps = [r["max_gap_while_speaking_s"] for r in rows if r["max_gap_while_speaking_s"] is not None]
    finals = [x for r in rows for x in r["final_latency_s"]]
    return {
        "clips": len(rows),
        "without_partial": sum(r["first_partial_s"] is None for r in rows),
        "first_partial_p50_s": median(firsts),
        "first_partial_p95_s": percentile(firsts, 95),
        "first_promised_p50_s": median(promised),
        "interval_p50_s": median(intervals),
        "interval_p95_s": percentile(intervals, 95),
        "max_gap_p50_s": median(gaps),
        "max_gap_p95_s": percentile(gaps, 95),
        "partials_per_clip": float(np.mean([r["partials"] for r in rows])) if rows else float("nan"),
        "final_p50_s": median(finals),
        "final_p95_s": percentile(finals, 95),
        "wer": aggregate_wer([r["text"] for r in rows], [r["final"] for r in rows]),
        "append_only_violations": sum(not r["append_only"] for r in rows),
    }


COLUMNS = (
    ("first p50", "first_partial_p50_s"),
    ("first p95", "first_partial_p95_s"),
    ("promised p50", "first_promised_p50_s"),
    ("intvl p50", "interval_p50_s"),
    ("intvl p95", "interval_p95_s"),
    ("maxgap p50", "max_gap_p50_s"),
    ("final p50", "final_p50_s"),
    ("final p95", "final_p95_s"),
)


def print_table(summaries: dict[str, dict[int, dict[str, Any]]], names: list[str], levels: list[int]) -> None:
    print("\nseconds; in brackets the ratio to the first configuration; WER of finals")
    header = f"{'config':>14} {'N':>3} {'clips':>5} " + " ".join(f"{c:>15}" for c, _ in COLUMNS)
    print(header + f" {'WER':>7} {'part/clip':>9} {'no part':>7} {'!append':>7}")
    for n in levels:
        reference = summaries[names[0]][n]
        for name in names:
            s = summaries[name][n]
            cells = []
            for _, key in COLUMNS:
                ratio = s[key] / reference[key] if reference[key] else float("nan")
                cells.append(f"{s[key]:7.3f} ({ratio:4.2f})")
            wer = f"{100 * s['wer']:6.2f}%" if s["wer"] is not None else "    n/a"
            print(
                f"{name:>14} {n:>3} {s['clips']:>5} "
                + " ".join(f"{c:>15}" for c in cells)
                + f" {wer} {s['partials_per_clip']:9.1f} {s['without_partial']:7d} {s['append_only_violations']:7d}"
            )


def check_targets(summary: dict[str, Any]) -> list[str]:
    return [
        f"first words shown p50 {summary['first_partial_p50_s']:.2f} s (≤ {TARGETS['first_partial_s']}; "
        f"first promised {summary['first_promised_p50_s']:.2f} s)"
        + (" ok" if summary["first_partial_p50_s"] <= TARGETS["first_partial_s"] else " MISSED"),
        f"interval p50 {summary['interval_p50_s']:.2f} s, max gap p50 {summary['max_gap_p50_s']:.2f} s "
        f"(≤ {TARGETS['interval_s']})" + (" ok" if summary["max_gap_p50_s"] <= TARGETS["interval_s"] else " MISSED"),
        f"final p50 {summary['final_p50_s']:.2f} s (≤ {TARGETS['final_p50_s']}), p95 {summary['final_p95_s']:.2f} s "
        f"(≤ {TARGETS['final_p95_s']})"
        + (
            " ok"
            if summary["final_p50_s"] <= TARGETS["final_p50_s"] and summary["final_p95_s"] <= TARGETS["final_p95_s"]
            else " MISSED"
        ),
    ]


def write_plot(path: Path, rows: dict[str, dict[int, list[dict[str, Any]]]], names: list[str], level: int) -> None:
    """Per configuration, the first clips of the level: speech (grey bar), partials (ticks), speech
    stopped (x) and the final (dot), in seconds from the speech onset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = 8
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 0.55 * shown + 1.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for y, row in enumerate(rows[name][level][:shown]):
            ax.barh(y, row["end_rel_s"], left=0, height=0.5, color="0.85")
            ax.plot(row["arrivals_rel_s"], [y] * len(row["arrivals_rel_s"]), "|", color="tab:blue", markersize=14)
            ax.plot(row["stops_rel_s"], [y] * len(row["stops_rel_s"]), "x", color="tab:red")
            ax.plot(row["finals_rel_s"], [y] * len(row["finals_rel_s"]), "o", color="tab:green")
        ax.set_yticks(range(min(shown, len(rows[name][level]))))
        ax.set_yticklabels([r["text"][:28] for r in rows[name][level][:shown]], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("seconds from speech onset")
        ax.set_title(f"{name}, {level} session(s): speech, partials |, stopped x, final o", fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def measure(
    urls: dict[str, str], clips: list[Clip], levels: list[int], rounds: int, per_session: int
) -> dict[str, dict[int, list[dict[str, Any]]]]:
    rows: dict[str, dict[int, list[dict[str, Any]]]] = {name: {n: [] for n in levels} for name in urls}
    names = list(urls)
    for name, url in urls.items():  # warm-up: one unmeasured utterance per server
        await run_level(url, clips, 1, 1, 99)
        print(f"  {name} warmed up", flush=True)
    for r in range(rounds):
        for n in levels:
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                spoken = await run_level(urls[name], clips, n, per_session, r)
                rows[name][n] += [s.metrics() for s in spoken]
                await asyncio.sleep(1.0)
        print(f"  round {r + 1}/{rounds} done (load average {os.getloadavg()[0]:.2f})", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=parse_config, action="append", help="NAME[@TREE]:KEY=VALUE,... (repeat)")
    parser.add_argument("--url", help="measure a running server instead (one configuration)")
    parser.add_argument("--sessions", default="1,4", help="concurrent sessions per level (default 1,4)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--utterances", type=int, default=4, help="clips per session per round")
    parser.add_argument("--full-server", action="store_true", help="keep the LLM and TTS on in child servers")
    parser.add_argument("--plot", type=Path, default=REPO / "bench-results" / "bench-streaming.png")
    args = parser.parse_args()
    levels = [int(v) for v in args.sessions.split(",") if v.strip()]
    configs: list[Config] = args.config or [Config("default", REPO, {})]
    load_start = os.getloadavg()
    print("synthesizing clips…", flush=True)
    clips = load_clips()
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        if args.url:
            urls["server"] = args.url.rstrip("/")
        else:
            for config in configs:
                env = {} if args.full_server else dict(ASR_ONLY)
                env |= config.env | {"MEDIASERVER_MAX_SESSIONS": str(max(levels) + 8)}
                log_path = args.plot.parent / f"bench-streaming-{config.name}.log"
                url, _ = stack.enter_context(child_server(log_path, 180.0, env, cwd=config.tree))
                urls[config.name] = url
                print(f"  {config.name}: {url} from {config.tree} {config.env}", flush=True)
        rows = asyncio.run(measure(urls, clips, levels, args.rounds, args.utterances))
    names = list(urls)
    summaries = {name: {n: summarize(rows[name][n]) for n in levels} for name in names}
    load_end = os.getloadavg()
    print(f"\nload average at start {load_start[0]:.2f}, at end {load_end[0]:.2f} (1 min)")
    print_table(summaries, names, levels)
    print("\ntargets (issue #15):")
    for name in names:
        for n in levels:
            print(f"  {name} N={n}: " + "; ".join(check_targets(summaries[name][n])))
    write_plot(args.plot, rows, names, levels[0])
    if len(levels) > 1:
        write_plot(args.plot.with_name(args.plot.stem + f"-n{levels[-1]}.png"), rows, names, levels[-1])
    result = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg": {"start": load_start, "end": load_end},
        "configs": {c.name: {"tree": str(c.tree), "env": c.env} for c in configs} if not args.url else {},
        "summaries": summaries,
        "rows": rows,
    }
    args.plot.with_suffix(".json").write_text(json.dumps(result, indent=2, default=float))
    print(f"\nplot: {args.plot}\nraw: {args.plot.with_suffix('.json')}")


if __name__ == "__main__":
    main()
