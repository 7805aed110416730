"""``make run`` on a fresh machine: the server answers while llama-server is still being compiled.

The build (tools/build_llama_cpp.py --background) writes its progress into the venv; a server that
finds no binary but a build under way keeps its LLM on and "building": ``/health`` says how far
(degraded meanwhile), chat and embeddings get a 503 with ``Retry-After`` from the build's pace,
speech is served, and the engine starts by itself once the binary is in place. A build that failed
is said as such. The binary here is the real llama-server, hidden until the "build" ends; the
build itself is a real process (a ``sleep``) whose pid the status names.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mediaserver.config import Settings
from mediaserver.llm import engine_binary
from mediaserver.llm.engine_binary import build_progress, find_binary
from tests.processes import front_server, stop_process

CHAT = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.fixture
def no_binary_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Where the venv's pointer, the build cache and the build status are, moved into ``tmp_path``
    (absolute paths replace the venv-relative names): no llama-server is found until the test
    writes the pointer. A ``sleep`` stands for the build process."""
    real = find_binary(Settings(_env_file=None))
    assert real is not None, "llama-server is not built (make setup)"
    monkeypatch.setattr(engine_binary, "VENV_POINTER", str(tmp_path / "pointer"))
    monkeypatch.setattr(engine_binary, "BUILD_STATUS", str(tmp_path / "status.json"))
    monkeypatch.setattr(engine_binary, "SERVER_CACHE", tmp_path / "cache")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    builder = subprocess.Popen(["sleep", "600"])
    status = {"pid": builder.pid, "started": time.time() - 30, "done": 50, "total": 200, "log": "/x/build.log"}
    (tmp_path / "status.json").write_text(json.dumps({**status, "error": None}))
    try:
        yield {"real": real, "builder": builder, "dir": tmp_path, "status": status}
    finally:
        stop_process(builder)


async def _get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.json()


async def _post(url: str, body: dict[str, Any]) -> tuple[int, Any, str | None]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.json(), resp.headers.get("Retry-After")


async def _engine_state(url: str) -> str:
    _, body = await _get(f"{url}/health")
    return str(body["llm"]["models"]["smollm2-135m-instruct"]["engine"]["state"])


async def test_the_llm_waits_for_the_build_and_starts_when_it_is_done(
    base_settings: Settings, no_binary_yet: dict[str, Any], speech: Any
) -> None:
    async with front_server(base_settings, llm_enabled=True, llm_preload=True) as server:
        status, health = await _get(f"{server.url}/health")
        assert status == 200 and health["features"]["llm"]["enabled"] is True
        engine = health["llm"]["models"]["smollm2-135m-instruct"]["engine"]
        assert engine["state"] == "building" and engine["healthy"] is False
        assert engine["build"]["compiled"] == 50 and engine["build"]["of"] == 200
        assert health["status"] == "degraded"

        status, body, retry_after = await _post(f"{server.url}/v1/chat/completions", CHAT)
        assert status == 503, body
        assert "still being built (25 %, 50 of 200 files" in body["error"]["message"]
        assert "/x/build.log" in body["error"]["message"]
        # 30 s for 50 files: about 90 s for the other 150.
        assert retry_after is not None and 80 <= int(retry_after) <= 120
        status, body, _ = await _post(f"{server.url}/v1/embeddings", {"model": "text-embedding-3-small", "input": "x"})
        assert status == 503 and "still being built" in body["error"]["message"]

        # Speech does not wait for the LLM.
        form = aiohttp.FormData()
        form.add_field("file", speech("Turn on the kitchen lights.").wav_bytes(), filename="a.wav")
        form.add_field("model", "whisper-1")
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{server.url}/v1/audio/transcriptions", data=form) as resp,
        ):
            assert resp.status == 200 and "kitchen" in (await resp.json())["text"].lower()

        # The build ends: its binary is in place, its status gone, its process done.
        (no_binary_yet["dir"] / "pointer").write_text(f"{no_binary_yet['real']}\n")
        (no_binary_yet["dir"] / "status.json").unlink()
        stop_process(no_binary_yet["builder"])
        deadline = time.monotonic() + 120  # the service looks every 2 s, then starts the engine
        while (state := await _engine_state(server.url)) != "ready":
            assert time.monotonic() < deadline, state
            await asyncio.sleep(0.2)
        status, body, _ = await _post(f"{server.url}/v1/chat/completions", CHAT)
        assert status == 200, body
        _, health = await _get(f"{server.url}/health")
        assert health["status"] == "ok"


def test_a_failed_build_is_said_with_its_log(no_binary_yet: dict[str, Any]) -> None:
    settings = Settings(_env_file=None)
    status = {**no_binary_yet["status"], "error": "llama-server failed (exit 1); the output ends above"}
    (no_binary_yet["dir"] / "status.json").write_text(json.dumps(status))
    progress = build_progress(settings)
    assert progress is not None and not progress.building
    problem = engine_binary.binary_problem(settings)
    assert problem is not None and problem.startswith("the llama-server build failed (llama-server failed (exit 1)")
    assert "/x/build.log" in problem and "make setup" in problem
    assert engine_binary.lasting_binary_problem(settings) == problem  # the LLM is off, with the reason


def test_a_build_whose_process_is_gone_is_a_failed_build(no_binary_yet: dict[str, Any]) -> None:
    stop_process(no_binary_yet["builder"])
    progress = build_progress(Settings(_env_file=None))
    assert progress is not None and not progress.building and progress.error == "the build process is gone"
    assert engine_binary.lasting_binary_problem(Settings(_env_file=None)) is not None


def test_a_configured_binary_is_never_waited_for(no_binary_yet: dict[str, Any]) -> None:
    settings = Settings(_env_file=None, llm_engine_binary=no_binary_yet["real"])
    assert build_progress(settings) is None and engine_binary.binary_problem(settings) is None
