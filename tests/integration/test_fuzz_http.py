"""Fuzzing the HTTP uploads, seeded and bounded, over raw sockets (no client library would send most
of this): truncated and garbage bodies, broken multipart, Content-Encodings that lie, Content-Lengths
that lie (shorter, longer, not a number, twice), broken chunked framing, random JSON. Every answer
must be below 500, nothing is logged at ERROR, no 5xx is counted, and a real request works after."""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.conftest import Clip, LiveServer
from tests.faults import metric_samples, raw_exchange, server_errors, statuses
from tests.fuzzgen import control_messages

SEED = 4141
SHORT = "Turn on the lights."
UPLOADS = {  # path -> the multipart field of its audio file (None: the raw body is the audio)
    "/api/willow": None,
    "/api/asr": "audio_file",
    "/v1/audio/transcriptions": "file",  # /v1/audio/translations: the same reader (and a slower model)
}
JSON_PATHS = ["/api/rtc/asr", "/v1/chat/completions", "/v1/audio/speech", "/v1/embeddings"]


def _request(path: str, body: bytes, headers: dict[str, str], *, length: str | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: fuzz", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if "Transfer-Encoding" not in headers:
        lines.append(f"Content-Length: {len(body) if length is None else length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _multipart(field: str, data: bytes, boundary: str = "fuzzbound", extra: bytes = b"") -> bytes:
    return (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="a.wav"\r\n'
            f"Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + data
        + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'.encode()
        + extra
        + f"--{boundary}--\r\n".encode()
    )


def http_cases(rng: random.Random, wav: bytes) -> list[tuple[str, bytes]]:
    cases: list[tuple[str, bytes]] = []
    form = {"Content-Type": "multipart/form-data; boundary=fuzzbound"}
    for path, field in UPLOADS.items():
        good = wav if field is None else _multipart(field, wav)
        headers = {"x-audio-codec": "wav"} if field is None else form
        for n in range(5):  # honest lengths, truncated bodies
            cut = good[: rng.randrange(len(good))]
            cases.append((f"{path} truncated {n}", _request(path, cut, headers)))
        for n in range(4):  # garbage
            junk = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 44, 1000, 5000])))
            cases.append((f"{path} garbage {n}", _request(path, junk, headers)))
        cases += [
            (f"{path} content-length shorter", _request(path, good, headers, length=str(len(good) // 2))),
            (f"{path} content-length longer", _request(path, good[:1000], headers, length=str(len(good)))),
            (f"{path} content-length not a number", _request(path, good, headers, length="12abc")),
            (f"{path} content-length negative", _request(path, good, headers, length="-5")),
            (f"{path} content-length twice", _request(path, good, {**headers, "Content-Length": "3"})),
            (
                f"{path} chunked, bad size",
                _request(path, b"zz\r\n" + good[:100], {**headers, "Transfer-Encoding": "chunked"}),
            ),
            (
                f"{path} chunked, truncated",
                _request(path, b"ffff\r\n" + good[:100], {**headers, "Transfer-Encoding": "chunked"}),
            ),
            (
                f"{path} chunked, with extension",
                _request(
                    path,
                    f"{len(good):x};x=y\r\n".encode() + good + b"\r\n0\r\n\r\n",
                    {**headers, "Transfer-Encoding": "chunked"},
                ),
            ),
        ]
        for encoding, body in (
            ("gzip", good),
            ("deflate", good),
            ("gzip", gzip.compress(good)[:-10]),
            ("deflate", zlib.compress(good)[: len(good) // 3]),
            ("br", good),
            ("zstd", good),
            ("x-unknown", good),
            ("gzip, gzip", gzip.compress(gzip.compress(good))),
        ):
            cases.append(
                (
                    f"{path} Content-Encoding {encoding} ({len(body)} bytes)",
                    _request(path, body, {**headers, "Content-Encoding": encoding}),
                )
            )
        if field is not None:
            for label, body, content_type in (
                ("boundary mismatch", _multipart(field, wav, "other"), form["Content-Type"]),
                ("no boundary parameter", _multipart(field, wav), "multipart/form-data"),
                ("no closing boundary", _multipart(field, wav)[:-14], form["Content-Type"]),
                ("part without headers", b"--fuzzbound\r\n\r\n" + wav + b"\r\n--fuzzbound--\r\n", form["Content-Type"]),
                (
                    "nested multipart",
                    _multipart(
                        field,
                        wav,
                        extra=b"--fuzzbound\r\nContent-Type: multipart/mixed; boundary=inner\r\n\r\n--inner--\r\n",
                    ),
                    form["Content-Type"],
                ),
                ("field name 70 kB", _multipart("f" * 70000, wav), form["Content-Type"]),
                ("not multipart at all", wav, "application/json"),
                ("no content type", wav, ""),
            ):
                cases.append(
                    (f"{path} {label}", _request(path, body, {"Content-Type": content_type} if content_type else {}))
                )
    json_headers = {"Content-Type": "application/json"}
    for path in JSON_PATHS:
        for n, message in enumerate(control_messages(rng, ["offer", "answer", "user"], 8, obj_key=None)):
            cases.append((f"{path} random JSON {n}", _request(path, message.encode(), json_headers)))
        cases.append((f"{path} nested JSON", _request(path, b"[" * 5000 + b"]" * 5000, json_headers)))
        cases.append((f"{path} non-UTF-8", _request(path, b'{"model": "\xff\xfe"}', json_headers)))
        cases.append((f"{path} gzip that is not", _request(path, b"{}", {**json_headers, "Content-Encoding": "gzip"})))
    return cases


async def test_http_upload_fuzz(
    server: LiveServer, caplog: pytest.LogCaptureFixture, speech: Callable[[str], Clip]
) -> None:
    cases = http_cases(random.Random(SEED), speech(SHORT).wav_bytes(16000))
    assert 120 <= len(cases) <= 300
    before = await metric_samples(server.url)
    limit = asyncio.Semaphore(8)
    started = time.monotonic()

    async def run(label: str, data: bytes) -> tuple[str, list[int], bytes]:
        # A body shorter than it says keeps the server waiting for the rest: that client hangs up
        # (its FIN; the server counts a 499). Every other client waits for its answer.
        hangs = label.endswith(("content-length longer", "chunked, truncated"))
        async with limit:
            answer = await raw_exchange(server.host, server.port, data, timeout_s=1 if hangs else 60, half_close=hangs)
        return label, statuses(answer), answer

    outcomes = await asyncio.gather(*(run(label, data) for label, data in cases))
    counts: Counter[int] = Counter()
    for label, found, answer in outcomes:
        counts.update(found)
        assert all(status < 500 for status in found), (label, answer[:300])
        head, _, body = answer.partition(b"\r\n\r\n")
        if found and found[0] >= 400 and b"application/json" in head:
            error = json.loads(body.split(b"\r\n\r\n")[0].split(b"HTTP/1.1")[0] or b"{}")
            assert "error" in error, (label, error)
    print(f"{len(cases)} requests in {time.monotonic() - started:.1f} s: statuses {dict(counts)}")
    assert counts[400] >= 50 and counts[200] >= 5
    after = await metric_samples(server.url)

    def server_faults(samples: dict[Any, float]) -> float:
        return sum(
            v
            for (name, labels), v in samples.items()
            if name == "mediaserver_requests_total" and dict(labels)["status"].startswith("5")
        )

    assert server_faults(after) == server_faults(before)
    assert server_errors(caplog) == []
    async with aiohttp.ClientSession() as http:  # a well-formed request right after
        form = aiohttp.FormData()
        form.add_field("file", speech(SHORT).wav_bytes(), filename="a.wav")
        form.add_field("model", "whisper-1")
        async with http.post(f"{server.url}/v1/audio/transcriptions", data=form) as resp:
            assert resp.status == 200 and "lights" in (await resp.json())["text"].lower()


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ('{"model": "tts-1", "voice": "alloy", "input": "Hi \ud800 there."}'.encode("utf-8", "surrogatepass"), "UTF-8"),
        ('{"model": "tts-1", "voice": "alloy", "input": "Hi there."}'.encode("utf-16"), "UTF-8"),
    ],
    ids=["utf-8 bytes of a surrogate", "utf-16"],
)
async def test_json_that_is_not_utf8_is_a_400_saying_so(
    server: LiveServer, caplog: pytest.LogCaptureFixture, raw: bytes, words: str
) -> None:
    """A review: json.loads takes bytes in UTF-16 or UTF-32, and UTF-8's encoding of a surrogate
    (b"\\xed\\xa0\\x80"), so a speech request with those bytes was still a 500."""
    async with aiohttp.ClientSession() as http, http.post(server.url + "/v1/audio/speech", data=raw) as response:
        assert response.status == 400, await response.text()
        error = (await response.json())["error"]
    assert words in error["message"], error
    assert server_errors(caplog) == []


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/audio/speech", {"model": "tts-1", "voice": "alloy", "input": "Hi \ud800 there."}),
        ("/v1/chat/completions", {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi \ud800"}]}),
        (
            "/v1/chat/completions",
            {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], "stop": ["\udc00"]},
        ),
        ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "Hi \ud800"}),
        ("/api/rtc/asr", {"type": "offer", "sdp": "v=0\ud800"}),
    ],
)
async def test_a_lone_surrogate_in_json_is_a_400_saying_so(
    server: LiveServer, caplog: pytest.LogCaptureFixture, path: str, body: dict[str, Any]
) -> None:
    """``"\\ud800"`` is valid JSON but not text: a trial's speech request got a 500 (the TTS cache key
    could not encode it), a chat request a 500 (the prompt), embeddings a 503 blaming the engine."""
    async with aiohttp.ClientSession() as http, http.post(server.url + path, data=json.dumps(body)) as response:
        assert response.status == 400, await response.text()
        error = (await response.json())["error"]
    message = error["message"] if isinstance(error, dict) else error
    assert "surrogate" in message, error
    assert server_errors(caplog) == []
