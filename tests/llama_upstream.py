"""llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``) on the bundled GGUF,
a child process on a loopback port: a real upstream for the LLM tests.

``chatml-function-calling`` is its chat format with tools: grammar-constrained calls (a named
``tool_choice`` always yields JSON matching the schema), streamed as ``delta.tool_calls``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

from mediaserver.llm.registry import bundled_gguf
from tests.ports import free_port


@contextlib.contextmanager
def llama_server(alias: str, *extra: str, api_key: str | None = None) -> Iterator[str]:
    """Run the server; yields its ``/v1`` base URL."""
    port = free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(bundled_gguf()), "--model_alias", alias,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1", "--verbose", "False",
        *extra,
    ]  # fmt: skip
    if api_key:
        command += ["--api_key", api_key]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}/v1"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + 120
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited: {process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            ready = urllib.request.Request(url + "/models", headers=headers)
            with contextlib.suppress(OSError), urllib.request.urlopen(ready, timeout=2) as r:
                if r.status == 200:
                    break
            assert time.monotonic() < deadline, "llama_cpp.server did not start"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
