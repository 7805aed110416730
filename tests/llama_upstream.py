"""llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``) or llama.cpp's own
``llama-server`` on the bundled GGUF, a child process on a loopback port: a real upstream for the LLM tests.

``chatml-function-calling`` is its chat format with tools: grammar-constrained calls (a named
``tool_choice`` always yields JSON matching the schema), streamed as ``delta.tool_calls``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from mediaserver.config import Settings
from mediaserver.llm.engine_binary import find_binary
from mediaserver.llm.registry import bundled_gguf
from mediaserver.llm.service import LlmService
from mediaserver.metrics import Metrics
from tests.conftest import LiveServer
from tests.ports import free_port
from tests.processes import stop_process


@contextlib.contextmanager
def llama_server(alias: str, *extra: str, api_key: str | None = None) -> Iterator[str]:
    """Run llama-cpp-python's server; yields its ``/v1`` base URL."""
    port = free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(bundled_gguf()), "--model_alias", alias,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1", "--verbose", "False",
        *extra,
    ]  # fmt: skip
    if api_key:
        command += ["--api_key", api_key]
    with _serving(command, port, api_key) as url:
        yield url


@contextlib.contextmanager
def llama_cpp_server(alias: str, *extra: str) -> Iterator[str]:
    """Run llama.cpp's own ``llama-server`` (the binary the embedded engine runs); yields its ``/v1`` URL."""
    binary = find_binary(Settings())
    assert binary is not None, "llama-server is not built (make setup)"
    port = free_port()
    command = [
        str(binary), "--model", str(bundled_gguf()), "--alias", alias, "--host", "127.0.0.1", "--port", str(port),
        "--ctx-size", "2048", "--threads", "1", "--no-webui", *extra,
    ]  # fmt: skip
    with _serving(command, port, None) as url:
        yield url


@contextlib.contextmanager
def _serving(command: list[str], port: int, api_key: str | None) -> Iterator[str]:
    # The log goes to a file, not a pipe: llama-server logs enough to fill one and block.
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=os.environ.copy())
        url = f"http://127.0.0.1:{port}/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        deadline = time.monotonic() + 120
        try:
            while True:
                if process.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"{command[0]} exited: {log.read().decode(errors='replace')[-2000:]}")
                ready = urllib.request.Request(url + "/models", headers=headers)
                with contextlib.suppress(OSError), urllib.request.urlopen(ready, timeout=2) as r:
                    if r.status == 200:
                        break
                assert time.monotonic() < deadline, f"{command[0]} did not start"
                time.sleep(0.2)
            yield url
        finally:
            stop_process(process)


@contextlib.asynccontextmanager
async def server_with_llm(
    server_factory: Callable[..., Awaitable[LiveServer]], base_settings: Settings, **settings: Any
) -> AsyncIterator[LiveServer]:
    """A live server whose LLM service is its own, built with ``settings`` (an upstream, other models,
    a projector ...); models and voices are the session's. The service is closed after."""
    service = LlmService(base_settings.model_copy(update=settings), Metrics())
    await service.start()
    try:
        yield await server_factory(llm=service, **settings)
    finally:
        await service.aclose()
