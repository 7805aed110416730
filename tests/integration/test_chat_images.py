"""``image_url`` parts on ``/v1/chat/completions`` through the official SDK: the LLM here reads text
only (the bundled SmolLM2 on llama.cpp), so an image is a 400 that says so, in OpenAI's shape, naming
the part; a malformed image URL is a 400 that says what a URL must be; text parts still work."""

from __future__ import annotations

import base64
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

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
    assert "messages[1].content[1]" in message and "text only" in message and "gpt-4o-mini" in message, message


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
