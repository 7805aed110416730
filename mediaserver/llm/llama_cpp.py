"""llama.cpp in this process (llama-cpp-python): the embedding model, and the benchmarks' baseline.

Chat runs on llama.cpp's own ``llama-server`` (``mediaserver.llm.engine``), which batches
concurrent generations; one in-process context served one generation at a time. Embeddings stay
here: they are micro-batched already (``mediaserver.llm.embeddings``), one ``Llama`` in embedding
mode in its own worker thread, and a second child process for a 135M model would cost more memory
and supervision than it saves. ``tools/bench_llm.py`` loads chat models the same way
(``_llama_kwargs``) as the in-process baseline it compares llama-server with.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mediaserver.config import Settings
from mediaserver.devices import DeviceChoice
from mediaserver.errors import ModelUnavailable
from mediaserver.llm.registry import LlmSource

log = logging.getLogger(__name__)

# llama.cpp's sampler defaults for the knobs the OpenAI API does not have.
TOP_K = 40
MIN_P = 0.05


def _llama_kwargs(settings: Settings, device: DeviceChoice | None) -> dict[str, Any]:
    # Half the cores by default: llama.cpp's threads wait on each other at every layer, so when
    # they share the cores with ASR (or anything else) a thread that is not scheduled stalls the
    # rest; measured here with the CPU shared, 2 threads ran at 1.9 tokens/s and 1 thread at 23.
    threads = settings.llm_threads or max(1, (os.cpu_count() or 2) // 2)
    on_gpu = device is not None and device.device == "cuda"
    return {
        "n_ctx": settings.llm_context_tokens,
        "n_batch": min(settings.llm_batch_tokens, settings.llm_context_tokens),
        "n_threads": threads,
        "n_threads_batch": settings.llm_threads_batch or threads,
        "n_gpu_layers": settings.llm_gpu_layers if on_gpu else 0,
        "verbose": False,
    }


def load_llama(source: LlmSource, settings: Settings, device: DeviceChoice | None, **extra: Any) -> Any:
    """Load a GGUF with llama.cpp (blocking: call it in a thread)."""
    from llama_cpp import Llama

    kwargs = {**_llama_kwargs(settings, device), **extra}
    try:
        if source.is_hub_id:
            repo_id, _, filename = source.location.partition(":")
            return Llama.from_pretrained(
                repo_id,
                filename,
                local_files_only=not settings.allow_model_download,
                cache_dir=str(settings.model_cache_dir / "gguf"),
                **kwargs,
            )
        return Llama(model_path=source.location, **kwargs)
    except Exception as exc:
        raise ModelUnavailable(f"LLM {source.name!r} could not be loaded from {source.location}: {exc}") from exc


class LlamaCppEmbedder:
    """Embeddings from a GGUF in llama.cpp's embedding mode (its own context, its own thread)."""

    def __init__(self, name: str, llama: Any) -> None:
        self.name = name
        self._llama = llama
        self.dimensions = int(llama.n_embd())
        self.max_batch_tokens = int(llama.n_batch)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"embed-{name}")

    @classmethod
    def load(cls, source: LlmSource, settings: Settings, device: DeviceChoice | None) -> LlamaCppEmbedder:
        import llama_cpp

        pooling = {
            "auto": llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED,
            "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
            "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
        }[settings.llm_embedding_pooling]
        size = max(settings.llm_embedding_max_input_tokens, 64)
        extra = {"embedding": True, "pooling_type": pooling, "n_ctx": size, "n_batch": size, "n_ubatch": size}
        llama = load_llama(source, settings, device, **extra)
        if llama.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_NONE:
            # A chat model has no pooling of its own: one vector per token is no embedding. Mean it.
            llama.close()
            extra["pooling_type"] = llama_cpp.LLAMA_POOLING_TYPE_MEAN
            llama = load_llama(source, settings, device, **extra)
        return cls(source.name, llama)

    def count_tokens(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=True, special=False))

    def _embed(self, texts: list[str]) -> list[list[float]]:
        vectors = self._llama.embed(texts, normalize=True, truncate=False)
        return [list(map(float, v)) for v in vectors]

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Unit-length vectors, one per text, computed in one llama.cpp batch."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._embed, texts)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        await asyncio.to_thread(self._llama.close)
