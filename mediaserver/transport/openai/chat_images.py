"""``image_url`` content parts of ``/v1/chat/completions`` messages: parsed and checked.

The OpenAI SDKs send images as ``{"type": "image_url", "image_url": {"url": "https://..." or
"data:image/png;base64,...", "detail": ...}}``. They become the message's ``images``
(``mediaserver.llm.types.ImageInput``): an upstream gets them as sent (a vision model on vLLM, say,
or another llama-server with a projector), the embedded llama-server when its model has a vision
projector (``llm_vision_projectors``); a text-only model answers a 400 naming the part.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from mediaserver.errors import InvalidParameter
from mediaserver.llm.types import ImageInput

IMAGE_URL_SCHEMES = ("https://", "http://", "data:image/")


class ImageUrl(BaseModel):
    model_config = ConfigDict(extra="ignore")
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["image_url"]
    image_url: ImageUrl


def image_inputs(index: int, content: object) -> tuple[ImageInput, ...]:
    """The images of message ``index``'s ``content``, checked (a 400 naming a malformed URL's part)."""
    if not isinstance(content, list):
        return ()
    images = []
    for part_index, part in enumerate(content):
        if not isinstance(part, ImagePart):
            continue
        where = f"messages[{index}].content[{part_index}]"
        url = part.image_url.url
        if not url.startswith(IMAGE_URL_SCHEMES) or (url.startswith("data:") and ";base64," not in url):
            raise InvalidParameter(
                f"invalid value for '{where}.image_url.url': an http(s) URL or a data:image/...;base64, URI",
                param="messages",
            )
        images.append(ImageInput(url, part.image_url.detail, where))
    return tuple(images)
