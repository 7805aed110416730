"""Soak test: K sessions stream real speech at real time for T minutes; is every utterance answered?

    python tools/soak.py                                   # 30 sessions (24 WebSocket + 6 WebRTC), 3 min
    python tools/soak.py --sessions 30 --rtc 6 --minutes 3 --out bench-results/soak
    python tools/soak.py --url http://127.0.0.1:19001 --server-pid 1234   # a running server
    python tools/soak.py --mixed --duration-min 30      # every face at once: RSS, fds, threads over time

``--mixed`` runs the mixed soak of tools/soak_mixed.py instead (uploads, speech, chat, device and
wake streams, Realtime sessions with a tool; ``python tools/soak.py --mixed --help``).

Each session is a device spoken to again and again: sentences of the 64-sentence Piper corpus
(tools/speech_corpus.py) separated by 3-6 s of silence (seeded; ``--pause-s``: about 26 sentences
per session in 3 minutes, the load of the soak in issue #14; ``--pause-s 1.2 2.4`` is a talker who
never stops, more than a 2-core machine transcribes), sent as 20 ms frames paced by the wall
clock, over the device WebSocket (``/api/ws/asr``, server VAD) or WebRTC (an aiortc peer,
hands-free on the data channel). The server's VAD ends each utterance; every final it sends
carries the stream time of its audio, which is matched to the sentence sent there (a sentence
split in two finals is joined). After the last frame each client keeps listening until every
sentence it sent has its final (``--drain-s`` at most), then the run reports:

- sent, answered, refused (no final, but an error event naming the sentence's audio: the server
  said it dropped it, e.g. ``overloaded``) and **lost** (neither by the end of the drain; must be
  0), spurious finals, errors;
- WER over all answered sentences (jiwer, lower case, no punctuation);
- latency percentiles: end of the sentence's audio → its final at the client (this includes the
  VAD's ``stream_vad_hangover_ms`` of silence, 500 ms by default), overall and per transport, and
  the server's own ``latency_ms`` (from a final's submission, after the session's earlier finals,
  to its transcript);
- the server's RSS and CPU (with its pid) and its ASR queue depth (``/metrics``) every 2 s: RSS
  start, peak and end, plotted with the latencies over time into ``OUT.png``, everything into
  ``OUT.json``. The client runs on the same machine: on a small one it takes a share of the CPU;
  what other processes used meanwhile is reported too (a shared machine skews every figure).

Needs the dev extras (jiwer, psutil, matplotlib) and the Piper voice. The child server inherits
``MEDIASERVER_*`` variables and gets ``max_sessions`` large enough for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fractions
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, CpuWatch, child_server, percentile
from speech_corpus import Utterance, synthesize

RATE = 16000
FRAME_S = 0.02
QUEUE_METRIC = "mediaserver_asr_queue_depth{"


@dataclass
class Sent:
    session: int
    text: str
    start_ms: int  # stream time of the sentence's first and last sample
    end_ms: int
    end_sent_at: float = 0.0  # monotonic time its last frame left
    finals: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SessionLog:
    index: int
    transport: str
    sent: list[Sent] = field(default_factory=list)
    finals: list[dict[str, Any]] = field(default_factory=list)  # {text, start_ms, end_ms, at, latency_ms}
    errors: list[str] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)  # error events naming an utterance's audio
    arrived: asyncio.Event = field(default_factory=asyncio.Event, repr=False)  # set by each final


def schedule(
    corpus: list[Utterance], session: int, seconds: float, seed: int, pause_s: tuple[float, float]
) -> tuple[np.ndarray, list[Sent]]:
    """The audio one session sends: sentences and pauses, and where each sentence lies."""
    rng = random.Random(seed * 1000 + session)
    parts: list[np.ndarray] = [np.zeros(int(RATE * rng.uniform(0.3, 2.0)), np.float32)]
    position = parts[0].size
    sent: list[Sent] = []
    index = session * 7
    while position < seconds * RATE:
        utterance = corpus[index % len(corpus)]
        index += 1
        start = position
        parts.append(utterance.audio)
        position += utterance.audio.size
        sent.append(Sent(session, utterance.text, start * 1000 // RATE, position * 1000 // RATE))
        pause = np.zeros(int(RATE * rng.uniform(*pause_s)), np.float32)
        parts.append(pause)
        position += pause.size
    return np.concatenate(parts), sent


def overlaps(event: dict[str, Any], sent: Sent) -> bool:
    return bool(min(event["end_ms"], sent.end_ms) > max(event["start_ms"], sent.start_ms))


def answered_all(log: SessionLog) -> bool:
    """Every sentence sent so far has a final, or an error naming its audio, that overlaps it."""
    return all(any(overlaps(f, s) for f in [*log.finals, *log.refused]) for s in log.sent if s.end_sent_at)


def note_error(log: SessionLog, code: object, message: object, detail: dict[str, Any]) -> None:
    """An error; one that carries an utterance's times stands in for its final (refused, not lost)."""
    log.errors.append(f"{code}: {message}")
    if "audio_start_ms" in detail and "audio_end_ms" in detail:
        log.refused.append({"code": code, "start_ms": detail["audio_start_ms"], "end_ms": detail["audio_end_ms"]})
        log.arrived.set()


async def drain(log: SessionLog, drain_s: float) -> None:
    """Keep listening until every sentence is answered, or ``drain_s`` at most."""
    deadline = time.monotonic() + drain_s
    while not answered_all(log) and (left := deadline - time.monotonic()) > 0:
        log.arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(log.arrived.wait(), left)


def pcm16(audio: np.ndarray) -> bytes:
    return bytes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


async def paced(audio: np.ndarray, sent: list[Sent], send: Any) -> None:
    """Send 20 ms frames on the wall clock (a late loop catches up, as a device's buffer does)."""
    frame = int(RATE * FRAME_S)
    started = time.monotonic()
    ends = {s.end_ms * RATE // 1000: s for s in sent}
    pending_ends = sorted(ends)
    for n, offset in enumerate(range(0, audio.size, frame)):
        due = started + n * FRAME_S
        if (wait := due - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        await send(audio[offset : offset + frame])
        while pending_ends and pending_ends[0] <= offset + frame:
            ends[pending_ends.pop(0)].end_sent_at = time.monotonic()


async def ws_session(url: str, log: SessionLog, audio: np.ndarray, drain_s: float) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.ws_connect(f"{url}/api/ws/asr", heartbeat=20) as ws:
        await ws.send_json({"type": "start", "mode": "server_vad", "sample_rate": RATE, "language": "en"})

        async def send(chunk: np.ndarray) -> None:
            await ws.send_bytes(pcm16(chunk))

        async def read() -> None:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                event = json.loads(msg.data)
                if event["type"] == "final":
                    log.finals.append(
                        {
                            "text": event["text"],
                            "start_ms": event["audio_start_ms"],
                            "end_ms": event["audio_end_ms"],
                            "at": time.monotonic(),
                            "latency_ms": event["latency_ms"],
                        }
                    )
                    log.arrived.set()
                elif event["type"] == "error":
                    note_error(log, event.get("code"), event.get("message"), event)

        reader = asyncio.create_task(read())
        await paced(audio, log.sent, send)
        await drain(log, drain_s)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def rtc_session(url: str, log: SessionLog, audio: np.ndarray, drain_s: float) -> None:
    import aiohttp
    import av
    from aiortc import RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import MediaStreamTrack

    queue: asyncio.Queue[np.ndarray] = asyncio.Queue()

    class Microphone(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.pts = 0

        async def recv(self) -> av.AudioFrame:
            chunk = await queue.get()  # paced by the sender below
            samples = (np.clip(np.repeat(chunk, 3), -1, 1) * 32767).astype(np.int16).reshape(1, -1)  # 48 kHz
            frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = 48000, self.pts, fractions.Fraction(1, 48000)
            self.pts += samples.shape[1]
            return frame

    pc = RTCPeerConnection()
    channel = pc.createDataChannel("chat", ordered=True)
    pc.addTrack(Microphone())
    opened = asyncio.Event()
    channel.on("open", opened.set)

    @channel.on("message")
    def on_message(data: str) -> None:
        event = json.loads(data)
        obj = event.get("obj") or {}
        if event["type"] == "infer" and obj.get("final"):
            log.finals.append(
                {
                    "text": obj["text"],
                    "start_ms": obj["audio_start_ms"],
                    "end_ms": obj["audio_end_ms"],
                    "at": time.monotonic(),
                    "latency_ms": obj["latency_ms"],
                }
            )
            log.arrived.set()
        elif event["type"] == "error":
            note_error(log, obj.get("code"), event.get("message"), obj)

    started_at = time.monotonic()
    hanging_up = asyncio.Event()  # the client's own close is not an error
    try:
        await pc.setLocalDescription(await pc.createOffer())
        async with aiohttp.ClientSession() as http:
            offer = {"sdp": pc.localDescription.sdp, "type": "offer"}
            async with http.post(f"{url}/api/rtc/asr", json=offer) as resp:
                answer = await resp.json()
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState in ("failed", "closed") and not hanging_up.is_set():
                log.errors.append(f"connection {pc.connectionState} at {time.monotonic() - started_at:.1f} s")

        @channel.on("close")
        def on_close() -> None:
            if not hanging_up.is_set():
                log.errors.append(f"data channel closed at {time.monotonic() - started_at:.1f} s")

        await asyncio.wait_for(opened.wait(), 30)
        channel.send(json.dumps({"type": "start", "obj": {"hands_free": True}}))

        async def send(chunk: np.ndarray) -> None:
            queue.put_nowait(chunk if chunk.size == 320 else np.pad(chunk, (0, 320 - chunk.size)))

        await paced(audio, log.sent, send)
        silence = asyncio.create_task(paced(np.zeros(int(RATE * drain_s), np.float32), [], send))
        await drain(log, drain_s)  # the microphone goes on hearing silence meanwhile
        silence.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await silence
    finally:
        hanging_up.set()
        await pc.close()


def match(log: SessionLog) -> list[dict[str, Any]]:
    """Give each final to the sentence its audio overlaps most; the finals no sentence claims."""
    spurious = []
    for final in log.finals:
        best, overlap = None, 0
        for sentence in log.sent:
            shared = min(final["end_ms"], sentence.end_ms) - max(final["start_ms"], sentence.start_ms)
            if shared > overlap:
                best, overlap = sentence, shared
        if best is None:
            spurious.append(final)
        else:
            best.finals.append(final)
    return spurious


class Sampler:
    """The server's RSS and CPU (with its pid) and its ASR queue depth (from /metrics) every ``period_s``."""

    def __init__(self, url: str, pid: int | None, period_s: float = 2.0) -> None:
        import psutil

        self.url = url
        self.process = psutil.Process(pid) if pid else None
        self.period_s = period_s
        self.samples: list[tuple[float, float, float, float]] = []  # (t, rss MB, cpu %, ASR jobs queued)

    async def run(self, started: float) -> None:
        import aiohttp

        if self.process is not None:
            self.process.cpu_percent()
        async with aiohttp.ClientSession() as http:
            while True:
                memory = self.process.memory_info().rss / 2**20 if self.process else float("nan")
                cpu = self.process.cpu_percent() if self.process else float("nan")
                self.samples.append((time.monotonic() - started, memory, cpu, await self._queued(http)))
                await asyncio.sleep(self.period_s)

    async def _queued(self, http: Any) -> float:
        try:
            async with http.get(f"{self.url}/metrics") as resp:
                text = await resp.text()
        except OSError:
            return float("nan")
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(QUEUE_METRIC))


def wer(references: list[str], hypotheses: list[str]) -> float:
    from tests.wer import corpus_wer

    return corpus_wer(references, hypotheses) or 0.0


def plot(
    path: Path, samples: list[tuple[float, float, float, float]], latencies: list[tuple[float, float, str]], title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(10, 9), sharex=True, height_ratios=(3, 1.5, 3))
    if samples:
        times = [s[0] for s in samples]
        top.plot(times, [s[1] for s in samples], label="server RSS (MB)")
        top.set_ylabel("RSS (MB)")
        cpu = top.twinx()
        cpu.plot(times, [s[2] for s in samples], color="tab:gray", alpha=0.4, label="CPU %")
        cpu.set_ylabel("server CPU (%)")
        middle.plot(times, [s[3] for s in samples], color="tab:red")
    middle.set_ylabel("ASR jobs queued")
    for transport, color in (("ws", "tab:blue"), ("rtc", "tab:orange")):
        points = [(t, v) for t, v, kind in latencies if kind == transport]
        bottom.scatter([t for t, _ in points], [v for _, v in points], s=6, color=color, label=transport)
    bottom.legend(loc="upper left")
    bottom.set_ylabel("end of speech → final (s)")
    bottom.set_xlabel("time since start (s)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def soak(args: argparse.Namespace, url: str, pid: int | None) -> dict[str, Any]:
    corpus = synthesize()
    seconds = args.minutes * 60
    logs: list[SessionLog] = []
    audios: list[np.ndarray] = []
    for index in range(args.sessions):
        audio, sent = schedule(corpus, index, seconds, args.seed, tuple(args.pause_s))
        logs.append(SessionLog(index, "rtc" if index < args.rtc else "ws", sent))
        audios.append(audio)
    sampler = Sampler(url, pid)
    others = CpuWatch(pid)
    others.start()
    started = time.monotonic()
    sampling = asyncio.create_task(sampler.run(started))

    async def run(log: SessionLog, audio: np.ndarray) -> None:
        await asyncio.sleep(log.index * args.ramp_s / max(1, args.sessions))  # not all at the same instant
        try:
            runner = rtc_session if log.transport == "rtc" else ws_session
            await runner(url, log, audio, args.drain_s)
        except Exception as exc:
            log.errors.append(f"session failed: {exc!r}")

    await asyncio.gather(*(run(log, audio) for log, audio in zip(logs, audios, strict=True)))
    other_cpu_cores = others.stop()
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    sentences = [s for log in logs for s in log.sent if s.end_sent_at]  # the run ended before the rest
    spurious = [f for log in logs for f in match(log)]
    answered = [s for s in sentences if s.finals]
    refused = [
        s
        for s in sentences
        if not s.finals and any(overlaps(r, s) for log in logs if log.index == s.session for r in log.refused)
    ]
    lost = [s for s in sentences if not s.finals and s not in refused]
    transports = {log.index: log.transport for log in logs}
    latencies = [
        (
            min(f["at"] for f in s.finals) - started,
            max(f["at"] for f in s.finals) - s.end_sent_at,
            transports[s.session],
        )
        for s in answered
    ]
    server_ms = [f["latency_ms"] for s in answered for f in s.finals]
    delays = [v for _, v, _ in latencies]
    rss = [s[1] for s in sampler.samples if s[1] == s[1]]  # not NaN (no pid)
    by_transport = {
        transport: {
            "sent": sum(1 for s in sentences if transports[s.session] == transport),
            "refused": sum(1 for s in refused if transports[s.session] == transport),
            "lost": sum(1 for s in lost if transports[s.session] == transport),
            "latency_s": {q: percentile([v for _, v, k in latencies if k == transport], q) for q in (50, 95)},
        }
        for transport in sorted(set(transports.values()))
    }
    return {
        "command": " ".join(sys.argv),
        "sessions": args.sessions,
        "rtc_sessions": args.rtc,
        "minutes": args.minutes,
        "sent": len(sentences),
        "answered": len(answered),
        "refused": len(refused),
        "refused_codes": sorted({str(r["code"]) for log in logs for r in log.refused}),
        "lost": len(lost),
        "lost_examples": [{k: v for k, v in asdict(s).items() if k != "finals"} for s in lost][:10],
        "split": sum(1 for s in answered if len(s.finals) > 1),
        "spurious_finals": len(spurious),
        "errors": [e for log in logs for e in log.errors],
        "wer": wer([s.text for s in answered], [" ".join(f["text"] for f in s.finals) for s in answered])
        if answered
        else None,
        "latency_s": {q: percentile(delays, q) for q in (50, 90, 95, 99)} | {"max": max(delays, default=float("nan"))},
        "server_latency_ms": {q: percentile(server_ms, q) for q in (50, 95, 99)},
        "by_transport": by_transport,
        "other_cpu_cores": other_cpu_cores,
        "asr_queued_max": max((s[3] for s in sampler.samples if s[3] == s[3]), default=None),
        "rss_mb": {"start": rss[0], "peak": max(rss), "end": rss[-1]} if rss else None,
        "sessions_detail": [
            {
                "index": log.index,
                "transport": log.transport,
                "sent": [(s.start_ms, s.end_ms, s.text) for s in log.sent if s.end_sent_at],
                "finals": [(f["start_ms"], f["end_ms"], f["text"]) for f in log.finals],
                "refused": [(r["start_ms"], r["end_ms"], r["code"]) for r in log.refused],
            }
            for log in logs
        ],
        "samples": sampler.samples,
        "latencies": latencies,
    }


def main() -> int:
    if "--mixed" in sys.argv[1:]:
        from soak_mixed import main as mixed

        return mixed([a for a in sys.argv[1:] if a != "--mixed"])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--rtc", type=int, default=6, help="how many of the sessions use WebRTC (the rest: WebSocket)")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument(
        "--drain-s", type=float, default=60.0, help="after the last frame, wait at most this long for late finals"
    )
    parser.add_argument("--ramp-s", type=float, default=5.0, help="start the sessions spread over this long")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument(
        "--pause-s",
        type=float,
        nargs=2,
        default=(3.0, 6.0),
        metavar=("MIN", "MAX"),
        help="silence between a session's sentences, drawn uniformly (1.2 2.4: a talker who never stops)",
    )
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--server-pid", type=int, help="its pid, for RSS")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "soak")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)

    if args.url:
        report = asyncio.run(soak(args, args.url.rstrip("/"), args.server_pid))
    else:
        env = {"MEDIASERVER_MAX_SESSIONS": str(max(64, args.sessions * 2))}
        with child_server(args.out.with_suffix(".server.log"), 180, env, log_level="INFO") as (url, process):
            report = asyncio.run(soak(args, url, process.pid))
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    title = (
        f"{args.sessions} sessions ({args.rtc} WebRTC) × {args.minutes:g} min: "
        f"{report['refused']} refused, {report['lost']} lost"
    )
    if report["other_cpu_cores"] is not None:
        title += f" (other processes: {report['other_cpu_cores']:.2f} cores)"
    plot(args.out.with_suffix(".png"), report["samples"], report["latencies"], title)
    print(f"sessions {report['sessions']} ({report['rtc_sessions']} WebRTC), {report['minutes']:g} min")
    print(
        f"sentences sent {report['sent']}, answered {report['answered']}, refused with an error naming them "
        f"{report['refused']} {report['refused_codes']}, LOST {report['lost']}"
    )
    print(f"split over two finals {report['split']}, spurious finals {report['spurious_finals']}")
    print(f"errors {len(report['errors'])}: {sorted(set(report['errors']))[:5]}")
    print(f"WER {report['wer']:.3f}" if report["wer"] is not None else "WER n/a")
    lat = report["latency_s"]
    print(
        f"end of speech → final: p50 {lat[50]:.2f} s, p90 {lat[90]:.2f} s, p95 {lat[95]:.2f} s, "
        f"p99 {lat[99]:.2f} s, max {lat['max']:.2f} s (includes the 0.5 s VAD hangover)"
    )
    server = report["server_latency_ms"]
    print(f"server latency_ms: p50 {server[50]:.0f}, p95 {server[95]:.0f}, p99 {server[99]:.0f}")
    for transport, row in report["by_transport"].items():
        lat = row["latency_s"]
        print(
            f"  {transport}: sent {row['sent']}, refused {row['refused']}, lost {row['lost']}, "
            f"p50 {lat[50]:.2f} s, p95 {lat[95]:.2f} s"
        )
    print(f"ASR jobs queued at most {report['asr_queued_max']}")
    if report["other_cpu_cores"] is not None:
        print(f"other processes (neither the server nor this client) kept {report['other_cpu_cores']:.2f} cores busy")
    if report["rss_mb"]:
        rss = report["rss_mb"]
        print(f"server RSS: start {rss['start']:.0f} MB, peak {rss['peak']:.0f} MB, end {rss['end']:.0f} MB")
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")
    return 1 if report["lost"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
