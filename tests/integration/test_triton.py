"""The ``triton`` ASR backend against a real Triton Inference Server.

``tritonserver`` comes from the ``nvidia-pytriton`` wheel (it runs on the CPU), in a venv this
module makes from PyPI with Debian's python3.11 on first use (``.triton-venv``, about 1.5 min; see
``tests/processes.py``). It serves ``tools/triton_whisper_server.py``: a model named ``infer_bls``
with the TensorRT-LLM Whisper example's tensors, decoding with faster-whisper and the bundled tiny.en.
The front server reaches it through ``tritonclient``, over gRPC and over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from mediaserver.asr.models import bundled_tiny_en_dir
from mediaserver.config import RemoteModel, Settings
from tests.conftest import Clip, long_clip
from tests.integration.test_bench_dataset import run_tool, write_manifest
from tests.integration.test_ws_stream import check_streamed_partials
from tests.processes import ManagedProcess, ensure_triton_venv, front_server, triton_process, wait_http_ok

log = logging.getLogger(__name__)
KITCHEN = "Turn on the kitchen lights and close the garage door."
WEATHER = "What is the weather like in Paris this afternoon?"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def triton(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ManagedProcess]:
    try:
        python, setup_s = await asyncio.to_thread(ensure_triton_venv)
    except FileNotFoundError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no Triton here: {exc}")
    if setup_s:
        log.warning("made the Triton venv in %.0f s", setup_s)
    model_dir = bundled_tiny_en_dir()
    assert model_dir is not None
    process = triton_process(python, str(model_dir), tmp_path_factory.mktemp("triton"))
    process.start()
    try:
        ready = f"http://127.0.0.1:{process.ports['http']}/v2/models/infer_bls/ready"
        await wait_http_ok(ready, timeout_s=120, process=process.process)
        yield process
    finally:
        process.stop()
        log.info("triton output:\n%s", process.output()[-3000:])


def remote(process: ManagedProcess, protocol: str = "grpc", **fields: Any) -> RemoteModel:
    values: dict[str, Any] = {
        "backend": "triton",
        "url": f"{protocol}://127.0.0.1:{process.ports[protocol]}",
        "multilingual": False,
        "probe_interval_s": 0.5,
        "retries": 1,
        "retry_backoff_ms": 50,
        **fields,
    }
    return RemoteModel(**values)


async def triton_counts(process: ManagedProcess) -> tuple[float, float]:
    """(inference requests, rows inferred) for infer_bls, from Triton's own Prometheus metrics."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{process.ports['metrics']}/metrics") as resp,
    ):
        text = await resp.text()

    def value(name: str) -> float:
        match = re.search(rf'^{name}{{model="infer_bls"[^}}]*}} (\S+)$', text, re.MULTILINE)
        assert match, f"{name} not in Triton's metrics"
        return float(match.group(1))

    return value("nv_inference_request_success"), value("nv_inference_count")


async def willow(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, Any]:
    async with http.post(f"{url}/api/willow", data=body) as resp:
        return resp.status, await resp.json()


async def test_grpc_one_request_per_batch(
    triton: ManagedProcess,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    wer: Callable[[str, str], float],
) -> None:
    clips = [speech(KITCHEN), speech(WEATHER)] * 3
    async with (
        front_server(base_settings, remote_models={"tiny.en": remote(triton)}) as front,
        aiohttp.ClientSession() as http,
    ):
        requests_before, rows_before = await triton_counts(triton)
        results = await asyncio.gather(*(willow(http, front.url, c.pcm16k_bytes) for c in clips))
        requests, rows = await triton_counts(triton)
        for clip, (status, body) in zip(clips, results, strict=True):
            assert status == 200 and wer(clip.text, body["text"]) <= 0.2, body
        assert rows - rows_before == 6
        assert requests - requests_before < 6  # the scheduler's batches went as multi-row requests
        async with http.get(f"{front.url}/health") as resp:
            info = await resp.json()
        assert info["backends"]["tiny.en"]["backend"] == "triton" and info["backends"]["tiny.en"]["state"] == "up"


async def test_http_concurrent_requests_and_long_audio(
    triton: ManagedProcess, base_settings: Settings, wer: Callable[[str, str], float]
) -> None:
    clip = long_clip(("kitchen", "weather", "remind"), repeat=3)  # > 30 s: cut into windows
    assert clip.pcm22k.size / clip.rate_hz > 30
    config = remote(triton, "http", triton_batching="concurrent")
    async with (
        front_server(base_settings, remote_models={"tiny.en": config}) as front,
        aiohttp.ClientSession() as http,
    ):
        form = aiohttp.FormData()
        form.add_field("file", clip.wav_bytes(), filename="long.wav")
        form.add_field("model", "whisper-1")
        async with http.post(f"{front.url}/v1/audio/transcriptions", data=form) as resp:
            body = await resp.json()
        assert resp.status == 200 and wer(clip.text, body["text"]) <= 0.25, body


async def test_a_stream_through_triton_keeps_its_partials(
    triton: ManagedProcess,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    wer: Callable[[str, str], float],
) -> None:
    async with front_server(base_settings, remote_models={"tiny.en": remote(triton)}) as front:
        await check_streamed_partials(front, speech, wer)


async def test_an_unknown_triton_model_is_a_502_and_the_other_model_works(
    triton: ManagedProcess, base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    models = {"tiny.en": remote(triton), "missing": remote(triton, model="no_such_model")}
    async with front_server(base_settings, remote_models=models) as front, aiohttp.ClientSession() as http:
        body = speech(KITCHEN).pcm16k_bytes
        async with http.post(f"{front.url}/api/willow?model=missing", data=body) as resp:
            error = await resp.json()
        assert resp.status == 502 and error["code"] == "backend_unavailable"
        assert f"the triton backend at grpc://127.0.0.1:{triton.ports['grpc']} (model 'missing')" in error["error"]
        assert "no_such_model" in error["error"]
        status, ok = await willow(http, front.url, body)
        assert status == 200 and "kitchen" in ok["text"].lower()
        async with http.get(f"{front.url}/health") as resp:
            info = await resp.json()
        assert info["backends"]["missing"]["state"] == "down" and info["status"] == "degraded"


async def test_bench_dataset_measures_triton_directly(
    triton: ManagedProcess, tmp_path: Path, speech: Callable[[str], Clip]
) -> None:
    manifest = write_manifest(tmp_path, speech)
    url = f"grpc://127.0.0.1:{triton.ports['grpc']}"
    argv = [str(manifest), "--target", "triton", "--url", url, "--num-tasks", "2", "--no-progress"]
    assert await run_tool([*argv, "--summary", str(tmp_path / "summary.json")]) == 0
    level = json.loads((tmp_path / "summary.json").read_text())["levels"][0]
    assert level["utterances"] == 3 and level["errors"] == 0 and level["wer"] <= 0.1, level


async def test_zz_triton_gone_is_a_502(
    triton: ManagedProcess, base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    """Last in the module: it stops the shared Triton."""
    async with (
        front_server(base_settings, remote_models={"tiny.en": remote(triton)}) as front,
        aiohttp.ClientSession() as http,
    ):
        triton.kill()
        status, error = await willow(http, front.url, speech(KITCHEN).pcm16k_bytes)
        assert status == 502 and error["code"] == "backend_unavailable"
        assert f"grpc://127.0.0.1:{triton.ports['grpc']} (model 'tiny.en') is unreachable" in error["error"]
