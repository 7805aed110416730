"""The benchmarks' in-process llama.cpp baseline (llama-cpp-python, a dev dependency): the
``Llama`` arguments that load a chat model as the server's llama-server engine runs it (threads,
context, batch; ``mediaserver.llm.engine_process``), so the two are compared on equal terms."""

from __future__ import annotations

from typing import Any

from mediaserver.config import Settings
from mediaserver.llm.engine_process import _threads


def llama_kwargs(settings: Settings) -> dict[str, Any]:
    threads = _threads(settings)
    return {
        "n_ctx": settings.llm_context_tokens,
        "n_batch": min(settings.llm_batch_tokens, settings.llm_context_tokens),
        "n_threads": threads,
        "n_threads_batch": settings.llm_threads_batch or threads,
        "n_gpu_layers": 0,
        "verbose": False,
    }
