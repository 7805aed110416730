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
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))
# The parts beside this file: clips and baseline, the device-style load, the report.
from bench_asr_clips import SENTENCES, Clip, load_extra_wavs, run_baseline, synthesize_clips  # noqa: E402
from bench_asr_load import CHUNK_BYTES, RssSampler, Run, load_run, one_utterance  # noqa: E402
from bench_asr_report import print_report, target_checks, write_plot  # noqa: E402
from benchlib import CpuWatch, get_json  # noqa: E402
from benchlib import child_server as benchlib_child_server  # noqa: E402

MODES = ("realtime", "burst")


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


def get_health(url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    data = get_json(f"{url}/health", timeout_s)
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def child_server(log_path: Path, startup_timeout_s: float) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """benchlib's ``python -m mediaserver`` on free loopback ports (every listener: HTTP, HTTPS off,
    Wyoming); yields (url, pid, /health)."""
    with benchlib_child_server(log_path, startup_timeout_s) as (url, process):
        yield url, process.pid, get_health(url) or {}


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
