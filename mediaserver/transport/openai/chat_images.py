"""``image_url`` content parts of ``/v1/chat/completions`` messages: parsed, checked, and refused
with a 400 that says why.

The OpenAI SDKs send images as ``{"type": "image_url", "image_url": {"url": "https://..." or
"data:image/png;base64,...", "detail": ...}}``. The LLM stage carries text only: the bundled llama.cpp
model has no vision projector, and messages to an upstream are sent as text. So a request with an
image gets a 400 naming the model and the part (before this, the same request was a parse error that
did not say what was wrong). Forwarding images to an upstream vision model (vLLM with Qwen2-VL, say)
needs the LLM stage's messages to carry parts; see the README's language-model section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from mediaserver.errors import InvalidParameter

IMAGE_URL_SCHEMES = ("https://", "http://", "data:image/")


class ImageUrl(BaseModel):
    model_config = ConfigDict(extra="ignore")
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["image_url"]
    image_url: ImageUrl


def refuse_images(model: str, contents: list[object]) -> None:
    """A 400 for the first image part of ``contents`` (each message's ``content``)."""
    for index, content in enumerate(contents):
        if not isinstance(content, list):
            continue
        for part_index, part in enumerate(content):
            if not isinstance(part, ImagePart):
                continue
            where = f"messages[{index}].content[{part_index}]"
            url = part.image_url.url
            if not url.startswith(IMAGE_URL_SCHEMES) or (url.startswith("data:") and ";base64," not in url):
                raise InvalidParameter(
                    f"invalid value for '{where}.image_url.url': an https URL or a data:image/...;base64, URI",
                    param="messages",
                )
            raise InvalidParameter(
                f"'{where}' is an image, and model {model!r} reads text only on this server: its LLM "
                "(llama.cpp without a vision projector, or an upstream reached with text messages) takes no "
                "image inputs; send text parts only",
                param="messages",
            )
