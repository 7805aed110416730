"""bench_asr's load: Willow-device clients over raw sockets, a run of N of them, and the server's side.

A client POSTs a clip to ``/api/willow`` chunked (2048-byte chunks of 16 kHz 16-bit mono PCM),
paced at real time or as fast as possible, and times the last body byte to the full response; a
run gathers N clients, samples the server's RSS and the other processes' CPU, and reads the
scheduler's counters from ``/metrics`` before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bench_asr_clips import SAMPLE_RATE_HZ, Clip, aggregate_wer, percentile, utterance_wer
from benchlib import CpuWatch

CHUNK_BYTES = 2048
CHUNK_SECONDS = CHUNK_BYTES / (SAMPLE_RATE_HZ * 2)  # 64 ms of 16 kHz 16-bit mono
RSS_INTERVAL_S = 0.2


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


# ----------------------------------------------------------------------------- the server's counters


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
