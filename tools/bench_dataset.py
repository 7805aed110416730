"""Measure an ASR deployment on a data set, through any face of mediaserver, or Triton directly.

    python tools/bench_dataset.py MANIFEST --target http --url http://127.0.0.1:19001 --num-tasks 1,4,8

MANIFEST is a JSONL file (one ``{"audio": "path", "text": "reference", "id": "optional"}`` a line;
paths relative to the file) or a directory of audio files, each with a ``.txt`` of the same stem.
``--make-corpus DIR`` writes such a directory from ``speech_corpus.py`` (Piper, deterministic).

Targets (what a real client of each face sends):

| target | request |
|---|---|
| ``http`` | ``POST /api/asr`` multipart ``audio_file`` (WAV) |
| ``openai`` | the ``openai`` SDK's ``audio.transcriptions.create`` (mediaserver's ``/v1``, vLLM, speaches) |
| ``willow`` | ``POST /api/willow`` as the device does: chunked transfer of raw 16 kHz PCM |
| ``wyoming`` | the ``wyoming`` client: ``transcribe``, audio start/chunks/stop (``--url tcp://host:10300``) |
| ``ws`` | ``/api/ws/asr`` push-to-talk: ``start``, PCM frames, ``stop``, the ``final`` |
| ``triton`` | ``tritonclient`` straight to Triton's ``infer_bls`` (``--url grpc://host:8001``, ``http://…:8000``) |

For each ``--num-tasks`` level, that many clients take utterances from the manifest until all are
done (a progress bar shows it). Out: corpus WER and CER (normalisation: lower case, punctuation other
than apostrophes removed, whitespace collapsed; the same for reference and hypothesis), RTF (wall time
÷ audio time, all clients together) and throughput (audio seconds per second, requests per second),
latency p50/p90/p99 (request sent → transcript received), a JSONL of every utterance's result
(``--out``), and a PNG of latency and throughput against concurrency (``--plot``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mediaserver.audio.decode import decode_any, encode_wav, float_to_pcm16  # noqa: E402

AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".webm", ".amr")
RATE = 16000
TARGETS = ("http", "openai", "willow", "wyoming", "ws", "triton")


@dataclass(frozen=True)
class Item:
    id: str
    text: str
    audio: npt.NDArray[np.float32]

    @property
    def seconds(self) -> float:
        return self.audio.size / RATE


@dataclass
class Result:
    id: str
    target: str
    concurrency: int
    reference: str
    hypothesis: str
    audio_s: float
    latency_s: float
    wer: float | None
    cer: float | None
    error: str | None = None


# --- manifests ----------------------------------------------------------------------------------


def load_manifest(path: Path, limit: int | None = None) -> list[Item]:
    """Items of a JSONL manifest or of a directory of audio + ``.txt`` files, decoded to 16 kHz mono."""
    entries: list[tuple[str, Path, str]] = []
    if path.is_dir():
        for audio in sorted(p for p in path.iterdir() if p.suffix.lower() in AUDIO_EXTENSIONS):
            text_file = audio.with_suffix(".txt")
            if text_file.is_file():
                entries.append((audio.stem, audio, text_file.read_text().strip()))
    else:
        for number, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                row = json.loads(line)
                audio_path = Path(row["audio"])
                audio_path = audio_path if audio_path.is_absolute() else path.parent / audio_path
                entries.append((str(row.get("id", f"{number:05d}")), audio_path, str(row["text"])))
    if not entries:
        raise SystemExit(f"{path}: no utterances (JSONL lines, or audio files with a .txt beside them)")
    return [Item(key, text, decode_any(audio.read_bytes())) for key, audio, text in entries[:limit]]


def make_corpus(directory: Path, count: int) -> None:
    """Write ``count`` sentences of ``speech_corpus.py`` as WAV + ``.txt`` (Piper, identical every run)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from speech_corpus import SENTENCES, synthesize

    directory.mkdir(parents=True, exist_ok=True)
    for utterance in synthesize(SENTENCES[:count]):
        (directory / f"{utterance.name}.wav").write_bytes(encode_wav(utterance.audio))
        (directory / f"{utterance.name}.txt").write_text(utterance.text + "\n")


# --- scoring --------------------------------------------------------------------------------------


def error_rates(references: list[str], hypotheses: list[str]) -> tuple[float, float]:
    """Corpus WER and CER (edits over all references' words / characters), normalized as every
    tool and test does (tests/wer.py: lower case, punctuation except apostrophes removed)."""
    from tests.wer import corpus_error_rates

    return corpus_error_rates(references, hypotheses) or (0.0, 0.0)


# --- targets --------------------------------------------------------------------------------------


class Target(Protocol):
    async def transcribe(self, item: Item) -> str: ...

    async def aclose(self) -> None: ...


class HttpAsr:
    """WIS ``POST /api/asr``."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url = url.rstrip("/")
        self.query = f"?model={args.model}" if args.model else ""
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=args.timeout_s))

    async def transcribe(self, item: Item) -> str:
        form = aiohttp.FormData()
        form.add_field("audio_file", encode_wav(item.audio), filename=f"{item.id}.wav", content_type="audio/wav")
        async with self.http.post(f"{self.url}/api/asr{self.query}", data=form) as resp:
            body = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {body}")
            return str(body["text"])

    async def aclose(self) -> None:
        await self.http.close()


class Willow(HttpAsr):
    """``POST /api/willow`` as a Willow device sends it: raw PCM in chunks of 2048 bytes."""

    async def transcribe(self, item: Item) -> str:
        pcm = float_to_pcm16(item.audio)

        async def chunks() -> AsyncIterator[bytes]:
            for offset in range(0, len(pcm), 2048):
                yield pcm[offset : offset + 2048]

        headers = {"x-audio-codec": "pcm", "x-audio-sample-rate": "16000", "x-audio-bits": "16", "x-audio-channel": "1"}
        async with self.http.post(f"{self.url}/api/willow{self.query}", data=chunks(), headers=headers) as resp:
            body = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {body}")
            return str(body["text"])


class OpenAITarget:
    """Any OpenAI-compatible ``/v1/audio/transcriptions``, through the ``openai`` SDK."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        from openai import AsyncOpenAI

        base = url.rstrip("/")
        self.client = AsyncOpenAI(
            base_url=base if base.endswith("/v1") else f"{base}/v1",
            api_key=args.api_key or "unused",
            timeout=args.timeout_s,
            max_retries=0,
        )
        self.model = args.model or "whisper-1"

    async def transcribe(self, item: Item) -> str:
        result = await self.client.audio.transcriptions.create(
            model=self.model, file=(f"{item.id}.wav", encode_wav(item.audio), "audio/wav"), response_format="json"
        )
        return str(result.text)

    async def aclose(self) -> None:
        await self.client.close()


class WyomingTarget:
    """Home Assistant's conversation with a Wyoming ASR server, one connection per utterance."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        parts = urllib.parse.urlsplit(url if "://" in url else f"tcp://{url}")
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 10300
        self.language = args.language
        self.model = args.model
        self.timeout_s = args.timeout_s

    async def transcribe(self, item: Item) -> str:
        from wyoming.asr import Transcribe, Transcript
        from wyoming.audio import AudioChunk, AudioStart, AudioStop
        from wyoming.client import AsyncTcpClient

        client = AsyncTcpClient(self.host, self.port)
        await client.connect()
        try:
            await client.write_event(Transcribe(name=self.model, language=self.language).event())
            await client.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
            pcm = float_to_pcm16(item.audio)
            for offset in range(0, len(pcm), 2048):
                await client.write_event(
                    AudioChunk(rate=RATE, width=2, channels=1, audio=pcm[offset : offset + 2048]).event()
                )
            await client.write_event(AudioStop().event())
            while True:
                event = await asyncio.wait_for(client.read_event(), self.timeout_s)
                if event is None:
                    raise RuntimeError("the Wyoming server closed the connection")
                if event.type == "error":
                    raise RuntimeError(f"Wyoming error: {event.data}")
                if Transcript.is_type(event.type):
                    return Transcript.from_event(event).text
        finally:
            await client.disconnect()

    async def aclose(self) -> None:
        pass


class DeviceWs:
    """The device stream ``/api/ws/asr`` in push-to-talk mode, one connection per utterance."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url = url.rstrip("/").replace("http://", "ws://").replace("https://", "wss://") + "/api/ws/asr"
        self.start: dict[str, Any] = {"type": "start", "mode": "push_to_talk", "sample_rate": RATE, "encoding": "pcm16"}
        if args.model:
            self.start["model"] = args.model
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=args.timeout_s))

    async def transcribe(self, item: Item) -> str:
        async with self.http.ws_connect(self.url) as ws:
            await ws.send_json(self.start)
            pcm = float_to_pcm16(item.audio)
            for offset in range(0, len(pcm), 6400):
                await ws.send_bytes(pcm[offset : offset + 6400])
            await ws.send_json({"type": "stop"})
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                event = json.loads(message.data)
                if event["type"] == "final":
                    return str(event["text"])
                if event["type"] == "error":
                    raise RuntimeError(f"{event['code']}: {event['message']}")
            raise RuntimeError(f"the socket closed ({ws.close_code}) before the final")

    async def aclose(self) -> None:
        await self.http.close()


class TritonTarget:
    """Triton's ``infer_bls`` (the TensorRT-LLM Whisper example's interface), one row per request."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        parts = urllib.parse.urlsplit(url)
        self.grpc = parts.scheme.startswith("grpc")
        hostport = f"{parts.hostname}:{parts.port or (8001 if self.grpc else 8000)}"
        if self.grpc:
            import tritonclient.grpc.aio as module
        else:
            import tritonclient.http.aio as module
        self.module: Any = module
        self.client: Any = module.InferenceServerClient(url=hostport)
        self.model = args.model or "infer_bls"
        english_only = args.language is None
        tokens = "<|startoftranscript|>" if english_only else f"<|startoftranscript|><|{args.language}|><|transcribe|>"
        self.prefix = (tokens + "<|notimestamps|>").encode()

    async def transcribe(self, item: Item) -> str:
        rows = [
            ("WAV", item.audio.reshape(1, -1).astype(np.float32), "FP32"),
            ("WAV_LENS", np.array([[item.audio.size]], np.int32), "INT32"),
            ("TEXT_PREFIX", np.array([[self.prefix]], dtype=object), "BYTES"),
        ]
        inputs = []
        for name, array, dtype in rows:
            tensor = self.module.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = await self.client.infer(self.model, inputs, outputs=[self.module.InferRequestedOutput("TRANSCRIPTS")])
        value = result.as_numpy("TRANSCRIPTS").reshape(-1)[0]
        text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        return " ".join(re.sub(r"<\|[^|>]*\|>", " ", text).split())

    async def aclose(self) -> None:
        await self.client.close()


def make_target(name: str, url: str, args: argparse.Namespace) -> Target:
    kinds: dict[str, Any] = {
        "http": HttpAsr,
        "openai": OpenAITarget,
        "willow": Willow,
        "wyoming": WyomingTarget,
        "ws": DeviceWs,
        "triton": TritonTarget,
    }
    target: Target = kinds[name](url, args)
    return target


# --- running ----------------------------------------------------------------------------------------


async def run_level(target: Target, name: str, items: list[Item], concurrency: int, progress: bool) -> list[Result]:
    from tqdm import tqdm

    queue: asyncio.Queue[Item] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    results: list[Result] = []
    bar = tqdm(total=len(items), desc=f"{name} x{concurrency}", unit="utt", disable=not progress, leave=False)

    async def client() -> None:
        while not queue.empty():
            item = queue.get_nowait()
            started = time.perf_counter()
            hypothesis, error = "", None
            try:
                hypothesis = await target.transcribe(item)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
            latency = time.perf_counter() - started
            wer, cer = error_rates([item.text], [hypothesis]) if error is None else (None, None)
            results.append(
                Result(item.id, name, concurrency, item.text, hypothesis, item.seconds, latency, wer, cer, error)
            )
            bar.update(1)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    bar.close()
    return results


def summarize(results: list[Result], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    audio_s = sum(r.audio_s for r in results)
    wer, cer = error_rates([r.reference for r in ok], [r.hypothesis for r in ok]) if ok else (float("nan"),) * 2
    latencies = np.array([r.latency_s for r in ok]) if ok else np.array([float("nan")])
    return {
        "concurrency": results[0].concurrency if results else 0,
        "utterances": len(results),
        "errors": len(results) - len(ok),
        "audio_s": round(audio_s, 2),
        "wall_s": round(wall_s, 3),
        "wer": round(wer, 4),
        "cer": round(cer, 4),
        "rtf": round(wall_s / audio_s, 4) if audio_s else None,
        "throughput_audio_s_per_s": round(audio_s / wall_s, 2) if wall_s else None,
        "requests_per_s": round(len(results) / wall_s, 2) if wall_s else None,
        "latency_p50_s": round(float(np.percentile(latencies, 50)), 3),
        "latency_p90_s": round(float(np.percentile(latencies, 90)), 3),
        "latency_p99_s": round(float(np.percentile(latencies, 99)), 3),
    }


def plot(summaries: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [s["concurrency"] for s in summaries]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (("latency_p50_s", "p50"), ("latency_p90_s", "p90"), ("latency_p99_s", "p99")):
        ax.plot(levels, [s[key] for s in summaries], marker="o", label=f"latency {label}")
    ax.set_xlabel("concurrent clients (--num-tasks)")
    ax.set_ylabel("latency (s)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    other = ax.twinx()
    other.plot(levels, [s["throughput_audio_s_per_s"] for s in summaries], "k--", marker="s", label="throughput")
    other.set_ylabel("throughput (audio s per s)")
    lines = ax.get_legend_handles_labels()[0] + other.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + other.get_legend_handles_labels()[1]
    ax.legend(lines, labels, loc="upper left")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(args: argparse.Namespace, items: list[Item]) -> tuple[list[dict[str, Any]], list[Result]]:
    target = make_target(args.target, args.url, args)
    summaries: list[dict[str, Any]] = []
    every: list[Result] = []
    try:
        for concurrency in args.num_tasks:
            started = time.perf_counter()
            results = await run_level(target, args.target, items, concurrency, not args.no_progress)
            summary = summarize(results, time.perf_counter() - started)
            summaries.append(summary)
            every.extend(sorted(results, key=lambda r: r.id))
            print(format_row(summary), flush=True)
    finally:
        await target.aclose()
    return summaries, every


def format_row(s: dict[str, Any]) -> str:
    return (
        f"N={s['concurrency']:>3}  utts={s['utterances']} errors={s['errors']}  WER={s['wer']:.2%} CER={s['cer']:.2%}  "
        f"RTF={s['rtf']}  throughput={s['throughput_audio_s_per_s']} audio s/s ({s['requests_per_s']} req/s)  "
        f"latency p50/p90/p99={s['latency_p50_s']}/{s['latency_p90_s']}/{s['latency_p99_s']} s"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", type=Path, nargs="?", help="JSONL manifest or directory of audio + .txt")
    parser.add_argument("--make-corpus", type=Path, metavar="DIR", help="write speech_corpus.py's sentences and exit")
    parser.add_argument("--count", type=int, default=64, help="sentences for --make-corpus")
    parser.add_argument("--target", choices=TARGETS, default="http")
    parser.add_argument("--url", default="http://127.0.0.1:19001", help="server URL (tcp://host:port for wyoming)")
    parser.add_argument("--num-tasks", default="1", help="concurrent clients; a list (1,4,16) runs each level")
    parser.add_argument("--model", default=None, help="model name to ask for (default: the server's)")
    parser.add_argument("--language", default=None, help="language to ask for (triton: None = English-only prompt)")
    parser.add_argument("--api-key", default=None, help="openai: the key")
    parser.add_argument("--limit", type=int, default=None, help="use the first N utterances")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=None, help="per-utterance results as JSONL")
    parser.add_argument("--summary", type=Path, default=None, help="the per-level summaries as JSON")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of latency and throughput vs concurrency")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    args.num_tasks = [int(n) for n in str(args.num_tasks).split(",") if n.strip()]
    if args.make_corpus is None and args.manifest is None:
        parser.error("give a MANIFEST (or --make-corpus DIR)")
    if any(n < 1 for n in args.num_tasks):
        parser.error("--num-tasks must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.make_corpus is not None:
        make_corpus(args.make_corpus, args.count)
        print(f"wrote {args.count} utterances to {args.make_corpus}")
        return 0
    items = load_manifest(args.manifest, args.limit)
    audio_s = sum(i.seconds for i in items)
    print(f"{len(items)} utterances, {audio_s:.1f} s of audio; target {args.target} at {args.url}", flush=True)
    print("normalisation: lower case, punctuation except apostrophes removed, whitespace collapsed", flush=True)
    summaries, results = asyncio.run(run(args, items))
    if args.out is not None:
        args.out.write_text("".join(json.dumps(asdict(r)) + "\n" for r in results))
    if args.summary is not None:
        args.summary.write_text(json.dumps({"target": args.target, "url": args.url, "levels": summaries}, indent=2))
    if args.plot is not None:
        plot(summaries, args.plot, f"{args.target} at {args.url}: {len(items)} utterances")
    return 1 if any(s["errors"] for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
