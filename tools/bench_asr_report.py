"""bench_asr's report: the tables, the target checks and the plot, from the baseline and the runs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_asr_clips import Baseline
from bench_asr_load import Run

NOISY_OTHER_CPU_CORES = 0.25  # warn when other processes used more than this many cores on average
# Targets, checked and reported as they are measured.
TARGET_SINGLE_LATENCY_RATIO = 1.10
TARGET_THROUGHPUT_RATIO = 3.0
TARGET_WER_DELTA = 0.005


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
