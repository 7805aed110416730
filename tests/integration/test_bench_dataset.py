"""tools/bench_dataset.py against a live server, through every face, on a three-utterance manifest:
so the tool cannot rot (the Triton face is run in test_triton.py, next to a real Triton)."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from mediaserver.transport.wyoming.server import WYOMING_PORT
from tests.conftest import SENTENCES, Clip, LiveServer

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_dataset", ROOT / "tools" / "bench_dataset.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def write_manifest(directory: Path, speech: Callable[[str], Clip]) -> Path:
    """A JSONL manifest of three Piper clips (WAV at 22.05 kHz: the tool resamples)."""
    lines = []
    for key in ("kitchen", "weather", "remind"):
        (directory / f"{key}.wav").write_bytes(speech(key).wav_bytes())
        lines.append(json.dumps({"id": key, "audio": f"{key}.wav", "text": SENTENCES[key]}))
    manifest = directory / "manifest.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


async def run_tool(argv: list[str]) -> int:
    tool = load_tool()
    code: int = await asyncio.to_thread(tool.main, argv)
    return code


@pytest.mark.parametrize("target", ["http", "openai", "willow", "ws", "wyoming"])
async def test_every_face(target: str, server: LiveServer, tmp_path: Path, speech: Callable[[str], Clip]) -> None:
    manifest = write_manifest(tmp_path, speech)
    url = f"tcp://127.0.0.1:{server.app[WYOMING_PORT]}" if target == "wyoming" else server.url
    levels = "1,2" if target == "http" else "2"
    argv = [str(manifest), "--target", target, "--url", url, "--num-tasks", levels, "--no-progress"]
    argv += ["--out", str(tmp_path / "results.jsonl"), "--summary", str(tmp_path / "summary.json")]
    if target == "http":
        argv += ["--plot", str(tmp_path / "latency.png")]
    assert await run_tool(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [level["concurrency"] for level in summary["levels"]] == [int(n) for n in levels.split(",")]
    for level in summary["levels"]:
        assert level["utterances"] == 3 and level["errors"] == 0
        assert level["wer"] <= 0.1 and level["cer"] <= 0.1, level
        assert level["rtf"] > 0 and level["throughput_audio_s_per_s"] > 0
        assert 0 < level["latency_p50_s"] <= level["latency_p90_s"] <= level["latency_p99_s"]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * len(summary["levels"])
    assert {r["id"] for r in rows} == {"kitchen", "weather", "remind"} and all(r["error"] is None for r in rows)
    if target == "http":
        assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_a_directory_manifest_and_a_dead_server(tmp_path: Path, speech: Callable[[str], Clip]) -> None:
    (tmp_path / "a.wav").write_bytes(speech("kitchen").wav_bytes())
    (tmp_path / "a.txt").write_text(SENTENCES["kitchen"])
    (tmp_path / "orphan.wav").write_bytes(speech("weather").wav_bytes())  # no transcript: not used
    argv = [str(tmp_path), "--url", "http://127.0.0.1:9", "--no-progress", "--summary", str(tmp_path / "s.json")]
    assert await run_tool(argv) == 1  # every request failed: the exit code says so
    level = json.loads((tmp_path / "s.json").read_text())["levels"][0]
    assert level["utterances"] == 1 and level["errors"] == 1
