"""The ``triton`` ASR backend: NVIDIA Triton Inference Server over KServe v2, with ``tritonclient``.

It calls a Whisper model of the shape NVIDIA's TensorRT-LLM Whisper example serves as ``infer_bls``:

| tensor | type | shape (per row) | |
|---|---|---|---|
| ``WAV`` | FP32 | [-1] | 16 kHz mono, zero-padded to the longest row of the request |
| ``WAV_LENS`` | INT32 | [1] | real samples of the row |
| ``MAX_NEW_TOKENS`` | INT32 | [1] | decode budget |
| ``TEXT_PREFIX`` | BYTES | [1] | decoder prompt, then a streaming session's forced prefix text |
| ``TRANSCRIPTS`` (out) | BYTES | [1] | the text |

The prompt is ``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`` (no language or task
tokens for English-only models). That model reads at most 30 s a row, so longer jobs are cut into windows of at most
``_WINDOW_S`` at the quietest 30 ms frame near the end of each, and their texts joined. Two ways
to send a scheduler batch (``triton_batching``): ``request`` (default) sends its rows as one request
of up to ``triton_max_batch`` rows; ``concurrent`` sends each row as its own request, padded to
``triton_pad_s`` so that Triton's dynamic batcher can merge requests of equal shape. The URL picks
the protocol: ``grpc://host:8001`` (``grpcs://`` with TLS) or ``http://host:8000`` (``https://``).

Limits of the interface: ``infer_bls`` neither detects the language (a request without one uses the
server's ``default_language``) nor returns timestamps (the whole text is one segment).
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mediaserver.asr.engine import AsrJob
from mediaserver.asr.remote import RemoteEngine, Unreachable
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray, Transcript

_WINDOW_S = 28.0  # leaves room for the model's own 30 s window
_SEARCH_S = 10.0  # where to look for a quiet cut before the window's end
_TAG = re.compile(r"<\|[^|>]*\|>")


@dataclass(frozen=True)
class _Row:
    job: int
    audio: AudioArray
    text_prefix: str


def split_long(audio: AudioArray, window_s: float = _WINDOW_S, search_s: float = _SEARCH_S) -> list[AudioArray]:
    """Cut audio into pieces of at most ``window_s``, each at the quietest 30 ms frame of its last ``search_s``."""
    limit = int(window_s * SAMPLE_RATE_HZ)
    frame = SAMPLE_RATE_HZ * 30 // 1000
    pieces: list[AudioArray] = []
    start = 0
    while audio.size - start > limit:
        lo = start + limit - int(search_s * SAMPLE_RATE_HZ)
        frames = audio[lo : start + limit][: (start + limit - lo) // frame * frame].reshape(-1, frame)
        cut = lo + int(np.argmin(np.square(frames).mean(axis=1))) * frame + frame // 2
        pieces.append(audio[start:cut])
        start = cut
    pieces.append(audio[start:])
    return pieces


class TritonEngine(RemoteEngine):
    samples = False  # the BLS decodes greedily: asking again would give the same answer
    kind = "triton"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        parts = urllib.parse.urlsplit(self.config.url)
        if parts.scheme not in ("grpc", "grpcs", "http", "https") or not parts.hostname:
            raise ValueError(
                f"remote model {self.name!r}: triton url must be grpc://host:port or http://host:port, not {self.url!r}"
            )
        self._grpc = parts.scheme.startswith("grpc")
        self._tls = parts.scheme in ("grpcs", "https")
        self._hostport = f"{parts.hostname}:{parts.port or (8001 if self._grpc else 8000)}"
        self._model = self.config.model or "infer_bls"
        self._client: Any = None
        self._module: Any = None

    def _triton(self) -> tuple[Any, Any]:
        """The tritonclient aio module and client (made on first use, inside the event loop)."""
        if self._client is None:
            if self._grpc:
                import tritonclient.grpc.aio as module

                self._client = module.InferenceServerClient(url=self._hostport, ssl=self._tls)
            else:
                import tritonclient.http.aio as module

                self._client = module.InferenceServerClient(
                    url=self._hostport,
                    conn_limit=self.config.max_concurrency,
                    conn_timeout=self.config.timeout_s,
                    ssl=self._tls,
                )
            self._module = module
        return self._module, self._client

    async def _close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _guard(self, coro: Any) -> Any:
        """Await a tritonclient call, turning "could not connect" into ``Unreachable``."""
        import aiohttp
        from tritonclient.utils import InferenceServerException

        try:
            return await coro
        except InferenceServerException as exc:
            if str(exc.status()) in ("StatusCode.UNAVAILABLE", "503"):
                raise Unreachable(exc.message() or str(exc)) from exc
            raise self.bad_answer(exc.message() or str(exc)) from exc
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
            raise Unreachable(str(exc) or type(exc).__name__) from exc

    async def _probe(self) -> None:
        _, client = self._triton()
        if not await self._guard(client.is_model_ready(self._model)):
            raise RuntimeError(f"Triton model {self._model!r} is not ready")

    def text_prefix(self, job: AsrJob, *, first: bool) -> str:
        options = job.options
        tokens = "<|startoftranscript|>"
        if self.multilingual:
            tokens += f"<|{self.language_of(job)}|><|{options.task}|>"
        tokens += "<|notimestamps|>"
        if first and options.prefix:
            tokens += " " + options.prefix.strip()
        return tokens

    async def _transcribe(self, jobs: Sequence[AsrJob]) -> list[Transcript | BaseException]:
        started = time.perf_counter()
        rows: list[_Row] = []
        for index, job in enumerate(jobs):
            for number, piece in enumerate(split_long(job.audio)):
                rows.append(_Row(index, piece, self.text_prefix(job, first=number == 0)))
        if self.config.triton_batching == "request":
            size = self.config.triton_max_batch
            groups = [rows[i : i + size] for i in range(0, len(rows), size)]
        else:
            groups = [[row] for row in rows]
        answers = await asyncio.gather(*(self._infer(group) for group in groups), return_exceptions=True)
        texts: dict[int, list[str]] = {i: [] for i in range(len(jobs))}
        failed: dict[int, BaseException] = {}
        for group, answer in zip(groups, answers, strict=True):
            for row_index, row in enumerate(group):
                if isinstance(answer, BaseException):
                    failed.setdefault(row.job, answer)
                else:
                    texts[row.job].append(answer[row_index])
        elapsed = time.perf_counter() - started
        results: list[Transcript | BaseException] = []
        for index, job in enumerate(jobs):
            error = failed.get(index)
            if error is not None:
                results.append(error if isinstance(error, Exception) else RuntimeError(str(error)))
                continue
            text = " ".join(t for t in texts[index] if t)
            results.append(self.transcript(job, text, language=self.language_of(job), elapsed_s=elapsed))
        return results

    async def _infer(self, rows: list[_Row]) -> list[str]:
        module, client = self._triton()
        pad_to = int(self.config.triton_pad_s * SAMPLE_RATE_HZ) if self.config.triton_batching == "concurrent" else 0
        width = max(pad_to, *(row.audio.size for row in rows))
        wav = np.zeros((len(rows), width), np.float32)
        for i, row in enumerate(rows):
            wav[i, : row.audio.size] = row.audio
        lens = np.array([[row.audio.size] for row in rows], np.int32)
        prefixes = np.array([[row.text_prefix.encode("utf-8")] for row in rows], dtype=object)
        budget = np.full((len(rows), 1), self.config.max_new_tokens, np.int32)
        inputs = []
        for name, array, dtype in (
            ("WAV", wav, "FP32"),
            ("WAV_LENS", lens, "INT32"),
            ("MAX_NEW_TOKENS", budget, "INT32"),
            ("TEXT_PREFIX", prefixes, "BYTES"),
        ):
            tensor = module.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        outputs = [module.InferRequestedOutput("TRANSCRIPTS")]
        result = await self.call(lambda: self._guard(client.infer(self._model, inputs, outputs=outputs)))
        return self._texts(result, len(rows))

    def _texts(self, result: Any, count: int) -> list[str]:
        try:
            array = result.as_numpy("TRANSCRIPTS")
        except Exception as exc:
            raise self.bad_answer(f"TRANSCRIPTS could not be read: {exc}") from None
        if array is None or array.size != count:
            raise self.bad_answer(f"expected {count} TRANSCRIPTS, got {None if array is None else array.shape}")
        texts = []
        for value in array.reshape(-1):
            if isinstance(value, bytes | np.bytes_):
                try:
                    value = bytes(value).decode("utf-8")
                except UnicodeDecodeError:
                    raise self.bad_answer("TRANSCRIPTS is not UTF-8") from None
            if not isinstance(value, str):
                raise self.bad_answer(f"TRANSCRIPTS holds {type(value).__name__}, not text")
            texts.append(" ".join(_TAG.sub(" ", value).split()))
        return texts
