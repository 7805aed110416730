"""The official ``openai`` Python SDK against the live server: only ``base_url`` changes.

Real Piper speech goes in as a WAV upload, the bundled Whisper models transcribe it, and every
response format, the translations endpoint, the model list and the error mapping are checked
through the SDK's own types and exceptions.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import SENTENCES

TIME = r"(\d{2}):(\d{2}):(\d{2})[,.](\d{3})"
SRT_TIMING = re.compile(rf"^{TIME.replace('[,.]', ',')} --> {TIME.replace('[,.]', ',')}$")
VTT_TIMING = re.compile(rf"^{TIME.replace('[,.]', '[.]')} --> {TIME.replace('[,.]', '[.]')}$")
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}


def _seconds(groups: tuple[str, ...]) -> float:
    hours, minutes, secs, millis = (int(g) for g in groups)
    return hours * 3600 + minutes * 60 + secs + millis / 1000


def _upload(speech: Any, key: str) -> tuple[str, bytes]:
    return ("speech.wav", speech(key).wav_bytes())


def _duration_s(speech: Any, key: str) -> float:
    clip = speech(key)
    return float(len(clip.pcm22k) / clip.rate_hz)


def _client(server: Any, api_key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture
async def client(server: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    async with _client(server) as sdk:
        yield sdk


async def _post_form(url: str, fields: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    form = aiohttp.FormData(default_to_multipart=True)
    for name, value in fields.items():
        if isinstance(value, tuple):
            form.add_field(name, value[1], filename=value[0], content_type="audio/wav")
        else:
            form.add_field(name, value)
    async with aiohttp.ClientSession() as session, session.post(url, data=form, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def _assert_openai_error(body: Any, param: str | None = None) -> dict[str, Any]:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == OPENAI_ERROR_KEYS, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["code"], str) and error["code"]
    if param is not None:
        assert error["param"] == param
    return dict(error)


# --- response formats ------------------------------------------------------------------------------


async def test_json_format(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    result = await client.audio.transcriptions.create(
        model="whisper-1", file=_upload(speech, "kitchen"), response_format="json"
    )
    assert isinstance(result, openai.types.audio.Transcription)
    assert wer(SENTENCES["kitchen"], result.text) <= 0.15, result.text


async def test_default_format_is_json(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    result = await client.audio.transcriptions.create(model="tiny.en", file=_upload(speech, "weather"))
    assert isinstance(result, openai.types.audio.Transcription)
    assert wer(SENTENCES["weather"], result.text) <= 0.15, result.text


async def test_text_format(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    result = await client.audio.transcriptions.create(
        model="whisper-1", file=_upload(speech, "remind"), response_format="text"
    )
    assert isinstance(result, str)
    assert not result.lstrip().startswith("{")  # plain text, not JSON
    assert wer(SENTENCES["remind"], result) <= 0.15, result


async def test_srt_format(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    key = "story"
    duration = _duration_s(speech, key)
    result = await client.audio.transcriptions.create(
        model="whisper-1", file=_upload(speech, key), response_format="srt"
    )
    assert isinstance(result, str)
    blocks = [b for b in result.strip().split("\n\n") if b.strip()]
    assert blocks, result
    texts: list[str] = []
    previous_end = 0.0
    for number, block in enumerate(blocks, start=1):
        lines = block.split("\n")
        assert lines[0] == str(number), block
        timing = SRT_TIMING.match(lines[1])
        assert timing, lines[1]
        start, end = _seconds(timing.groups()[:4]), _seconds(timing.groups()[4:])
        assert previous_end - 0.001 <= start < end <= duration + 0.1, (start, end, duration)
        previous_end = end
        assert len(lines) >= 3 and lines[2].strip(), block
        texts.append(" ".join(lines[2:]))
    assert wer(SENTENCES[key], " ".join(texts)) <= 0.15, result


async def test_vtt_format(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    key = "garden"
    result = await client.audio.transcriptions.create(
        model="whisper-1", file=_upload(speech, key), response_format="vtt"
    )
    assert isinstance(result, str)
    assert result.startswith("WEBVTT")
    lines = result.split("\n")
    timings = [line for line in lines if "-->" in line]
    assert timings, result
    for line in timings:
        assert VTT_TIMING.match(line), line  # "." before the milliseconds, never ","
    cue_text = [line for line in lines[1:] if line.strip() and "-->" not in line]
    assert wer(SENTENCES[key], " ".join(cue_text)) <= 0.15, result


async def test_verbose_json_segments(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    key = "music"
    duration = _duration_s(speech, key)
    result = await client.audio.transcriptions.create(
        model="whisper-1", file=_upload(speech, key), response_format="verbose_json"
    )
    assert isinstance(result, openai.types.audio.TranscriptionVerbose)
    raw = result.to_dict()
    assert raw["task"] == "transcribe"
    assert result.language == "english"
    assert abs(result.duration - duration) <= 0.1, (result.duration, duration)
    assert wer(SENTENCES[key], result.text) <= 0.15, result.text
    assert result.segments, raw
    for index, seg in enumerate(result.segments):
        assert seg.id == index
        assert 0.0 <= seg.start < seg.end <= result.duration + 0.01, seg
        assert seg.text.strip()
        assert seg.tokens and all(isinstance(t, int) for t in seg.tokens)
        assert 0.0 <= seg.no_speech_prob <= 1.0
    assert " ".join(s.text for s in result.segments).split() == result.text.split()
    assert result.words is None  # segments only, unless words are asked for
    assert result.usage is not None
    assert result.usage.type == "duration"
    assert result.usage.seconds >= duration


async def test_verbose_json_word_timestamps(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    key = "kitchen"
    duration = _duration_s(speech, key)
    result = await client.audio.transcriptions.create(
        model="whisper-1",
        file=_upload(speech, key),
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    assert result.words, result.to_dict()
    expected_words = len(SENTENCES[key].split())
    assert abs(len(result.words) - expected_words) <= 2, [w.word for w in result.words]
    previous_start = 0.0
    for word in result.words:
        assert word.word and word.word == word.word.strip()
        assert previous_start <= word.start <= word.end <= duration + 0.1, word
        previous_start = word.start
    assert wer(SENTENCES[key], " ".join(w.word for w in result.words)) <= 0.15


async def test_verbose_json_word_and_segment_timestamps(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    key = "weather"
    result = await client.audio.transcriptions.create(
        model="whisper-1",
        file=_upload(speech, key),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert result.words and result.segments, result.to_dict()
    assert wer(SENTENCES[key], " ".join(w.word for w in result.words)) <= 0.15
    first, last = result.segments[0], result.segments[-1]
    for word in result.words:
        assert first.start - 0.5 <= word.start <= word.end <= last.end + 0.5, word


# --- request options -------------------------------------------------------------------------------


async def test_language_and_prompt(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    key = "remind"
    result = await client.audio.transcriptions.create(
        model="whisper-1",
        file=_upload(speech, key),
        language="en",
        prompt="A voice assistant hears requests about household appointments.",
        response_format="verbose_json",
    )
    assert result.language == "english"
    assert wer(SENTENCES[key], result.text) <= 0.15, result.text
    assert "household" not in result.text.lower()  # the prompt conditions the decoder, it is not echoed


async def test_temperature_zero(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    key = "garden"
    result = await client.audio.transcriptions.create(
        model="whisper-1", file=_upload(speech, key), temperature=0.0, response_format="verbose_json"
    )
    assert wer(SENTENCES[key], result.text) <= 0.15, result.text
    assert result.segments and all(s.temperature == 0.0 for s in result.segments)


async def test_translation_with_whisper_1(client: openai.AsyncOpenAI, speech: Any, wer: Any) -> None:
    key = "music"
    result = await client.audio.translations.create(model="whisper-1", file=_upload(speech, key))
    assert isinstance(result, openai.types.audio.Translation)
    assert wer(SENTENCES[key], result.text) <= 0.3, result.text


async def test_models_list(client: openai.AsyncOpenAI) -> None:
    ids = [m.id async for m in client.models.list()]
    assert {"tiny.en", "base", "whisper-1"} <= set(ids), ids
    assert len(ids) == len(set(ids))


async def test_models_retrieve_every_listed_model(client: openai.AsyncOpenAI) -> None:
    listed = [m async for m in client.models.list()]
    for model in listed:  # ASR models, their aliases, chat and embedding models
        retrieved = await client.models.retrieve(model.id)
        assert retrieved.model_dump() == model.model_dump()
    whisper = await client.models.retrieve("whisper-1")
    assert (whisper.id, whisper.object, whisper.owned_by) == ("whisper-1", "model", "mediaserver")
    chat = await client.models.retrieve("gpt-4o-mini")
    assert chat.id == "gpt-4o-mini"


async def test_models_retrieve_unknown_is_model_not_found(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("no-such-model")
    assert caught.value.code == "model_not_found"
    assert caught.value.param == "model"
    assert "no-such-model" in caught.value.message


# (diarized transcripts and gpt-4o-transcribe-diarize: tests/integration/test_diarize.py)


# --- errors through the SDK ------------------------------------------------------------------------


async def test_unknown_model_names_the_available_ones(client: openai.AsyncOpenAI, speech: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.audio.transcriptions.create(model="large-v9", file=_upload(speech, "kitchen"))
    error = caught.value
    assert error.status_code == 400
    assert error.param == "model"
    assert error.type == "invalid_request_error"
    message = error.body["message"]  # type: ignore[index]
    assert "large-v9" in message and "tiny.en" in message and "base" in message, message


async def test_bad_language(client: openai.AsyncOpenAI, speech: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.audio.transcriptions.create(model="whisper-1", file=_upload(speech, "kitchen"), language="xx")
    assert caught.value.param == "language"
    assert "xx" in caught.value.body["message"]  # type: ignore[index]


async def test_bad_response_format_via_extra_body(client: openai.AsyncOpenAI, speech: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.audio.transcriptions.create(
            model="whisper-1", file=_upload(speech, "kitchen"), extra_body={"response_format": "pdf"}
        )
    _assert_openai_error({"error": caught.value.body}, param="response_format")
    assert "pdf" in caught.value.body["message"]  # type: ignore[index]


async def test_bad_response_format_raw_multipart(server: Any, speech: Any) -> None:
    status, body = await _post_form(
        f"{server.url}/v1/audio/transcriptions",
        {"model": "whisper-1", "response_format": "pdf", "file": _upload(speech, "kitchen")},
    )
    assert status == 400
    _assert_openai_error(body, param="response_format")


async def test_garbage_file(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.audio.transcriptions.create(model="whisper-1", file=("speech.wav", b"\x13\x37garbage" * 500))
    assert caught.value.code == "invalid_audio" and caught.value.param == "file"
    message = caught.value.body["message"]  # type: ignore[index]
    # FFmpeg's reason, not its errno and internals
    assert message.startswith("Invalid audio: could not decode the file (") and "Errno" not in message, message


async def test_timestamp_granularities_need_verbose_json(client: openai.AsyncOpenAI, speech: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.audio.transcriptions.create(
            model="whisper-1", file=_upload(speech, "kitchen"), response_format="json", timestamp_granularities=["word"]
        )
    assert caught.value.param == "timestamp_granularities"


async def test_missing_file(server: Any) -> None:
    status, body = await _post_form(f"{server.url}/v1/audio/transcriptions", {"model": "whisper-1"})
    assert status == 400
    _assert_openai_error(body, param="file")


async def test_missing_model(server: Any, speech: Any) -> None:
    status, body = await _post_form(f"{server.url}/v1/audio/transcriptions", {"file": _upload(speech, "kitchen")})
    assert status == 400
    _assert_openai_error(body, param="model")


async def test_non_multipart_body(server: Any) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.url}/v1/audio/transcriptions", json={"model": "whisper-1", "file": "abc"}) as resp,
    ):
        assert resp.status == 400
        error = _assert_openai_error(await resp.json())
    assert "multipart" in error["message"]


async def test_english_only_model_cannot_translate(client: openai.AsyncOpenAI, speech: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.audio.translations.create(model="tiny.en", file=_upload(speech, "kitchen"))
    assert caught.value.param == "model"
    assert "English-only" in caught.value.body["message"]  # type: ignore[index]


# --- auth and limits -------------------------------------------------------------------------------


async def test_api_key_auth(server_factory: Any, speech: Any, wer: Any) -> None:
    guarded = await server_factory(api_keys=["k-123"])
    async with _client(guarded, api_key="k-123") as good:
        result = await good.audio.transcriptions.create(model="whisper-1", file=_upload(speech, "kitchen"))
        assert wer(SENTENCES["kitchen"], result.text) <= 0.15
        assert "tiny.en" in [m.id async for m in good.models.list()]
    async with _client(guarded, api_key="wrong") as bad:
        with pytest.raises(openai.AuthenticationError) as caught:
            await bad.audio.transcriptions.create(model="whisper-1", file=_upload(speech, "kitchen"))
        assert caught.value.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
    status, body = await _post_form(f"{guarded.url}/v1/audio/transcriptions", {"model": "whisper-1"})
    assert status == 401
    assert body["error"]["code"] == "unauthorized"


async def test_upload_over_the_limit_is_413(server_factory: Any) -> None:
    small = await server_factory(max_upload_bytes=64 * 1024)
    payload = ("big.wav", b"\x00\x01" * (100 * 1024))  # 200 KB
    async with _client(small) as sdk:
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk.audio.transcriptions.create(model="whisper-1", file=payload)
    assert caught.value.status_code == 413
    assert caught.value.code == "audio_too_large"
    status, body = await _post_form(f"{small.url}/v1/audio/transcriptions", {"model": "whisper-1", "file": payload})
    assert status == 413
    error = body["error"]
    assert set(error) == OPENAI_ERROR_KEYS
    assert "limit" in error["message"]
