"""Embeddings from a GGUF on its own ``llama-server`` child, in llama.cpp's embedding mode.

The same engine binary as chat (``mediaserver.llm.engine_process``), started with ``--embeddings``
and a pooling, so llama.cpp is built once per machine (tools/build_llama_cpp.py) and no native
library runs inside this process. Requests are micro-batched before they get here
(``mediaserver.llm.embeddings``); one call sends a batch as one ``/v1/embeddings`` request, which
the child spreads over its ``llm_embedding_slots`` slots. The child is supervised like the chat
engine: restarted when it dies, killed and restarted when it hangs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from mediaserver.config import Settings
from mediaserver.devices import DeviceChoice
from mediaserver.errors import ModelUnavailable, Overloaded
from mediaserver.llm.engine import hub_gguf
from mediaserver.llm.engine_process import LlamaServerProcess
from mediaserver.llm.registry import LlmSource

log = logging.getLogger(__name__)

# llama-server's answer to /v1/embeddings when the model pools nothing (a chat model): one vector
# per token is no embedding, so such a model is started again with mean pooling.
NO_POOLING = "not OAI compatible"


class EmbeddingServerProcess(LlamaServerProcess):
    """A llama-server child in embedding mode: ``--embeddings``, the pooling, and a context that
    holds ``llm_embedding_slots`` inputs of ``llm_embedding_max_input_tokens`` each."""

    def __init__(
        self,
        alias: str,
        model_path: str,
        settings: Settings,
        device: DeviceChoice | None,
        pooling: str,
        on_restart: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(alias, model_path, settings, device, on_restart=on_restart)
        self.label = f"{alias} (embeddings)"  # (the chat engine of the same model logs as the alias)
        self.pooling = pooling  # auto (the model's own), mean, cls or last
        self.slots = settings.llm_embedding_slots
        self.chat_template = None  # no chat here: the chat engine's template is not this child's to check

    def command(self, binary: Path) -> list[str]:
        s = self.settings
        size = max(s.llm_embedding_max_input_tokens, 64)
        args = super().command(binary)
        for flag, value in (
            ("--parallel", self.slots),
            ("--ctx-size", self.slots * size),
            ("--batch-size", self.slots * size),
            # An input's tokens are pooled within one physical batch: it must hold the longest input.
            ("--ubatch-size", size),
        ):
            args[args.index(flag) + 1] = str(value)
        args.append("--embeddings")
        if self.pooling != "auto":
            args += ["--pooling", self.pooling]
        return args

    async def request(self, path: str, body: dict[str, Any]) -> Any:
        """POST to the child; its own error message (not just a status) in a ModelUnavailable. While it
        restarts or does not answer, and when it dies or stalls mid-request (it is supervised, and
        restarted), a 503 with ``Retry-After`` (``Overloaded``): retrying will help (a fault trial got
        ``model_unavailable``, which says it will not)."""
        if self._http is None:
            raise ModelUnavailable(f"the embedding engine of {self.alias!r} is {self.state}")
        await self.wait_ready()
        timeout = aiohttp.ClientTimeout(total=self.settings.llm_request_timeout_s)
        try:
            async with self._http.post(f"{self.base_url}{path}", json=body, timeout=timeout) as response:
                text = await response.text()
                if response.status != 200:
                    try:
                        message = json.loads(text)["error"]["message"]
                    except (ValueError, KeyError, TypeError):
                        message = text[:200]
                    raise ModelUnavailable(
                        f"the embedding engine of {self.alias!r} answered {response.status}: {message}"
                    )
                return json.loads(text)
        except (aiohttp.ClientError, TimeoutError) as exc:
            if self.state in ("failed", "stopped"):
                raise ModelUnavailable(
                    f"the embedding engine of {self.alias!r} is not running: {self.last_exit}"
                ) from exc
            raise Overloaded(
                f"the embedding engine of {self.alias!r} did not answer ({exc!r}); it is restarted if it died or hangs",
                retry_after_s=self.settings.llm_engine_restart_max_backoff_s,
            ) from exc


class LlamaServerEmbedder:
    """Unit-length embedding vectors and token counts from an ``EmbeddingServerProcess``."""

    def __init__(self, name: str, process: EmbeddingServerProcess, dimensions: int) -> None:
        self.name = name
        self.process = process
        self.dimensions = dimensions

    @classmethod
    async def start(
        cls,
        source: LlmSource,
        settings: Settings,
        device: DeviceChoice | None,
        on_restart: Callable[[], None] | None = None,
    ) -> LlamaServerEmbedder:
        """Start the child and wait until it embeds (ModelUnavailable naming why if it cannot)."""
        location = await asyncio.to_thread(hub_gguf, source.location, settings) if source.is_hub_id else source.location
        pooling = settings.llm_embedding_pooling
        process = EmbeddingServerProcess(source.name, location, settings, device, pooling, on_restart)
        try:
            await process.start()
            try:
                probe = await cls._post(process, ["."])
            except ModelUnavailable as exc:
                if pooling != "auto" or NO_POOLING not in exc.message:
                    raise
                log.info(
                    "embedding model %s has no pooling of its own (a vector per token): starting it again with "
                    "mean pooling (llm_embedding_pooling names one to start with)",
                    source.name,
                )
                await process.aclose()
                process = EmbeddingServerProcess(source.name, location, settings, device, "mean", on_restart)
                await process.start()
                probe = await cls._post(process, ["."])
        except BaseException:
            await process.aclose()
            raise
        log.info("embedding model %s: pooling %s, %d dimensions", source.name, process.pooling, len(probe[0]))
        return cls(source.name, process, len(probe[0]))

    @staticmethod
    async def _post(process: EmbeddingServerProcess, texts: list[str]) -> list[list[float]]:
        await process.wait_ready()
        body = {"input": texts, "model": process.alias, "encoding_format": "float"}
        answer = await process.request("/v1/embeddings", body)
        rows = sorted(answer["data"], key=lambda row: row["index"])
        return [[float(x) for x in row["embedding"]] for row in rows]

    async def count_tokens(self, texts: list[str]) -> list[int]:
        """Each text's length in the model's tokens, as it will be embedded (with BOS)."""
        await self.process.wait_ready()
        answers = await asyncio.gather(
            *(self.process.request("/tokenize", {"content": text, "add_special": True}) for text in texts)
        )
        return [len(answer["tokens"]) for answer in answers]

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Unit-length vectors (llama-server normalises them), one per text, in one request."""
        return await self._post(self.process, texts)

    async def aclose(self) -> None:
        await self.process.aclose()
