"""The ``openai`` ASR backend: any OpenAI-compatible ``/v1/audio/transcriptions`` as an engine.

vLLM serving Whisper, speaches, OpenAI itself or another mediaserver. Each job is one multipart
request (16 kHz 16-bit WAV), sent concurrently up to ``max_concurrency`` through one aiohttp
connection pool kept alive between requests; a scheduler batch is therefore that many concurrent
requests, which the upstream batches itself (vLLM continuously, mediaserver in its own scheduler).

What the API cannot carry is handled here: a streaming session's forced prefix is applied to the
answer by word alignment (``force_prefix``), and ``beam_size`` stays the upstream's default.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from mediaserver.asr.engine import AsrJob
from mediaserver.asr.remote import RemoteEngine, Unreachable
from mediaserver.audio.decode import encode_wav
from mediaserver.errors import ApiError, BackendTimeout, BackendUnavailable
from mediaserver.events import Segment, Transcript, Word
from mediaserver.languages import normalize_language


class OpenAIEngine(RemoteEngine):
    kind = "openai"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._base = self.config.url.rstrip("/")
        self._model = self.config.model or "whisper-1"
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            config = self.config
            headers = {}
            if config.api_key is not None:
                headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=config.max_concurrency, keepalive_timeout=30),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s),
                headers=headers,
            )
        return self._session

    async def _close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _probe(self) -> None:
        async def probe() -> None:
            try:
                async with self._client().get(f"{self._base}/models") as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"GET /models answered {resp.status}")
                    await resp.read()
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
                raise Unreachable(str(exc)) from exc

        await probe()

    async def _transcribe(self, jobs: Sequence[AsrJob]) -> list[Transcript | BaseException]:
        answers = await asyncio.gather(*(self._one(job) for job in jobs), return_exceptions=True)
        return [a if isinstance(a, Transcript | Exception) else RuntimeError(str(a)) for a in answers]

    def _form(self, job: AsrJob, wav: bytes) -> aiohttp.FormData:
        options = job.options
        form = aiohttp.FormData()
        form.add_field("file", wav, filename="audio.wav", content_type="audio/wav")
        form.add_field("model", self._model)
        form.add_field("response_format", self.config.response_format)
        if self.config.response_format == "verbose_json":
            form.add_field("timestamp_granularities[]", "segment")
            if options.word_timestamps:
                form.add_field("timestamp_granularities[]", "word")
        if options.task == "transcribe" and self.multilingual and options.language:
            form.add_field("language", options.language)
        if options.initial_prompt:
            form.add_field("prompt", options.initial_prompt)
        if len(options.temperature) == 1:
            form.add_field("temperature", str(options.temperature[0]))
        return form

    async def _one(self, job: AsrJob) -> Transcript:
        wav = encode_wav(job.audio)
        path = "/audio/translations" if job.options.task == "translate" else "/audio/transcriptions"
        started = time.perf_counter()

        async def request() -> tuple[int, bytes]:
            try:
                async with self._client().post(f"{self._base}{path}", data=self._form(job, wav)) as resp:
                    return resp.status, await resp.read()
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
                # Nothing or only part was processed; a transcription is idempotent, so a retry is safe.
                raise Unreachable(str(exc) or type(exc).__name__) from exc

        status, body = await self.call(request)
        if status != 200:
            raise self._error(status, body)
        return self._parse(job, body, time.perf_counter() - started)

    def _error(self, status: int, body: bytes) -> ApiError:
        detail = _error_message(body)
        if status == 504:
            return BackendTimeout(f"{self.label} timed out upstream (HTTP 504): {detail}; retry later")
        return BackendUnavailable(f"{self.label} answered HTTP {status}: {detail}")

    def _parse(self, job: AsrJob, body: bytes, elapsed_s: float) -> Transcript:
        try:
            payload = json.loads(body)
        except ValueError:
            raise self.bad_answer(f"not JSON: {body[:80]!r}") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
            raise self.bad_answer(f"no 'text' in {body[:80]!r}")
        language = None
        if isinstance(payload.get("language"), str) and payload["language"]:
            try:
                language = normalize_language(payload["language"])
            except ValueError:
                language = None
        segments = _segments(payload)
        return self.transcript(job, payload["text"], language=language, elapsed_s=elapsed_s, segments=segments)


def _error_message(body: bytes) -> str:
    """The message of an OpenAI (``{"error": {"message"}}``) or WIS (``{"error": "..."}``) error body."""
    try:
        payload = json.loads(body)
    except ValueError:
        text = body[:200].decode("utf-8", "replace").strip()
        return text or "(empty body)"
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    if isinstance(payload, dict) and isinstance(payload.get("detail"), str):  # FastAPI servers (speaches, vLLM)
        return str(payload["detail"])
    return body[:200].decode("utf-8", "replace")


def _number(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, int | float) else default


def _reported(value: Any) -> float | None:
    """A score as the server reported it; None (left out of our answers) when it did not."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _segments(payload: dict[str, Any]) -> list[Segment]:
    """verbose_json segments (and words, placed in the segment they start in); [] when absent."""
    raw = payload.get("segments")
    words_raw = payload.get("words")
    words = [
        Word(_number(w.get("start")), _number(w.get("end")), " " + str(w.get("word", "")).strip(), None)
        for w in (words_raw if isinstance(words_raw, list) else [])
        if isinstance(w, dict)
    ]
    segments: list[Segment] = []
    for seg in raw if isinstance(raw, list) else []:
        if not isinstance(seg, dict) or not isinstance(seg.get("text"), str):
            continue
        start, end = _number(seg.get("start")), _number(seg.get("end"))
        tokens = seg.get("tokens")
        segments.append(
            Segment(
                id=len(segments),
                seek=int(_number(seg.get("seek"))),
                start_s=start,
                end_s=end,
                text=seg["text"],
                tokens=tuple(int(t) for t in tokens if isinstance(t, int)) if isinstance(tokens, list) else (),
                temperature=_reported(seg.get("temperature")),
                avg_logprob=_reported(seg.get("avg_logprob")),
                compression_ratio=_reported(seg.get("compression_ratio")),
                no_speech_prob=_reported(seg.get("no_speech_prob")),
                words=tuple(w for w in words if start <= w.start_s < end),
            )
        )
    if words and segments:  # words outside every segment go to the nearest end
        before = tuple(w for w in words if w.start_s < segments[0].start_s)
        after = tuple(w for w in words if w.start_s >= segments[-1].end_s)
        segments[0] = dataclasses.replace(segments[0], words=before + segments[0].words)
        segments[-1] = dataclasses.replace(segments[-1], words=segments[-1].words + after)
    return segments
