"""What a remote ASR engine costs: the same utterances through several servers, side by side in one run.

    python tools/bench_remote.py --spawn-hop --num-tasks 1,8 --rounds 3
    python tools/bench_remote.py --compare request=http://127.0.0.1:19341 concurrent=http://127.0.0.1:19342

``--spawn-hop`` starts two ``python -m mediaserver`` children on loopback: ``local`` decodes tiny.en
itself; ``hop`` has no model of its own and sends tiny.en to ``local`` through its ``openai`` backend
(``remote_models``). Both are measured through ``hop`` and ``local`` alternately, so the difference
is the hop (one more HTTP request, WAV encoding, a second queue). ``--compare NAME=URL ...`` measures
servers you started (for example two fronts of one Triton, one per ``triton_batching`` mode).

For each concurrency level and round, every server gets the whole manifest in turn (the order rotates
per round); the table gives each server's median over rounds of throughput (audio s per s) and
latency p50/p90, and their ratio to the first server. Ratios, not absolute figures, are what to read:
the machine is shared and its speed varies, but both sides see the same variation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import bench_dataset  # noqa: E402

from tests.ports import free_port  # noqa: E402


def spawn(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    base = {
        "MEDIASERVER_WYOMING_ENABLED": "false",
        "MEDIASERVER_TTS_ENABLED": "false",
        "MEDIASERVER_SAVE_AUDIO_DIR": str(log.parent / "audio"),
    }
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mediaserver", "--host", "127.0.0.1", "--http-port", str(port)],
            cwd=REPO,
            env={**os.environ, **base, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def wait_healthy(url: str, timeout_s: float = 120.0) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(f"{url}/health") as resp:
                    if resp.status == 200 and "backends" not in (body := await resp.json()):
                        return
                    if resp.status == 200 and all(b["state"] == "up" for b in body["backends"].values()):
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.3)
    raise TimeoutError(f"{url} did not become healthy")


async def measure(args: argparse.Namespace, servers: dict[str, str], items: list[bench_dataset.Item]) -> None:
    for url in servers.values():
        await wait_healthy(url)
    names = list(servers)
    targets = {name: bench_dataset.make_target(args.target, url, args) for name, url in servers.items()}
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    try:
        for name in names:  # warm-up: first requests load and compile what they need
            await bench_dataset.run_level(targets[name], name, items[:2], 1, False)
        for level in args.num_tasks:
            for round_number in range(args.rounds):
                order = names[round_number % len(names) :] + names[: round_number % len(names)]
                for name in order:
                    started = time.perf_counter()
                    results = await bench_dataset.run_level(targets[name], name, items, level, not args.no_progress)
                    summary = bench_dataset.summarize(results, time.perf_counter() - started)
                    runs.setdefault((name, level), []).append(summary)
                    print(f"  round {round_number + 1} {name:>12}: {bench_dataset.format_row(summary)}", flush=True)
    finally:
        for target in targets.values():
            await target.aclose()
    print()
    columns = ("N", "server", "throughput", "ratio", "p50 s", "ratio", "p90 s", "WER")
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, (3, 12, 11, 6, 7, 6, 7, 6), strict=True)), "errors")
    for level in args.num_tasks:
        first = None
        for name in names:
            summaries = runs[(name, level)]
            throughput = statistics.median(s["throughput_audio_s_per_s"] for s in summaries)
            p50 = statistics.median(s["latency_p50_s"] for s in summaries)
            p90 = statistics.median(s["latency_p90_s"] for s in summaries)
            wer = statistics.median(s["wer"] for s in summaries)
            errors = sum(s["errors"] for s in summaries)
            if first is None:
                first = (throughput, p50)
            print(
                f"{level:>3} {name:>12} {throughput:>11.2f} {throughput / first[0]:>6.2f} {p50:>7.3f} "
                f"{p50 / first[1]:>6.2f} {p90:>7.3f} {wer:>6.2%} {errors}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", type=Path, nargs="?", help="default: 24 sentences of speech_corpus.py")
    parser.add_argument("--spawn-hop", action="store_true", help="start local and hop servers (see above)")
    parser.add_argument("--compare", nargs="+", default=[], metavar="NAME=URL")
    parser.add_argument("--target", choices=bench_dataset.TARGETS, default="http")
    parser.add_argument("--num-tasks", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    args.num_tasks = [int(n) for n in args.num_tasks.split(",")]
    args.model, args.language, args.api_key, args.timeout_s = None, None, None, 120.0
    workdir = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    manifest = args.manifest
    if manifest is None:
        manifest = workdir / "corpus"
        bench_dataset.make_corpus(manifest, args.limit)
    items = bench_dataset.load_manifest(manifest, args.limit)
    print(f"{len(items)} utterances, {sum(i.seconds for i in items):.1f} s of audio", flush=True)
    servers = dict(pair.split("=", 1) for pair in args.compare)
    children: list[subprocess.Popen[bytes]] = []
    if args.spawn_hop:
        local_port, hop_port = free_port(), free_port()
        local = f"http://127.0.0.1:{local_port}"
        remote = (
            f'{{"tiny.en": {{"backend": "openai", "url": "{local}/v1", "model": "tiny.en", "multilingual": false}}}}'
        )
        children.append(spawn({}, local_port, workdir / "local.log"))
        children.append(spawn({"MEDIASERVER_REMOTE_MODELS": remote}, hop_port, workdir / "hop.log"))
        servers = {"local": local, "hop": f"http://127.0.0.1:{hop_port}", **servers}
        print(f"local decodes at {local}; hop sends tiny.en there (logs in {workdir})", flush=True)
    if not servers:
        parser.error("give --spawn-hop and/or --compare NAME=URL")
    try:
        asyncio.run(measure(args, servers, items))
    finally:
        for child in children:
            os.killpg(child.pid, signal.SIGTERM)
        for child in children:
            child.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
