"""JSON request bodies of the OpenAI faces: read once with a size limit, validated by a pydantic
model, and every problem a 400 (or 413) in OpenAI's words naming the parameter."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from mediaserver.errors import ApiError, AudioTooLarge, InvalidParameter
from mediaserver.state import SETTINGS
from mediaserver.transport.common import json_error, loads_json, read_body_limited

Body = TypeVar("Body", bound=BaseModel)


class RequestTooLarge(ApiError):
    status = 413
    code = "request_too_large"


async def read_json_object(request: web.Request, *, max_bytes: int, setting: str) -> dict[str, Any]:
    """The request body as a JSON object; past ``max_bytes`` (the setting named ``setting``) a 413."""
    try:
        raw = await read_body_limited(
            request, max_bytes=max_bytes, idle_timeout_s=request.app[SETTINGS].body_read_timeout_s
        )
    except AudioTooLarge as exc:
        raise RequestTooLarge(f"{exc.message} ({setting})") from None
    try:
        body = loads_json(raw)
    except ValueError as exc:
        message = json_error(exc, "the request body is not valid JSON: send a JSON object")
        raise InvalidParameter(message, param="body") from None
    if not isinstance(body, dict):
        raise InvalidParameter("the request body must be a JSON object", param="body")
    return body


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "bytes"})


def _union_member(part: str) -> bool:
    """A ``loc`` part that names a type pydantic tried ('str', 'list[str]', 'function-after[...]',
    "literal['a','b']"), not a field."""
    return (
        part in _TYPE_TAGS
        or "[" in part
        or part.startswith(("function-", "literal", "tagged-union"))
        or part.lstrip("_")[:1].isupper()  # a model of a union ('_TextPart', 'ImagePart'): fields are lowercase
    )


def _place(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """The place in the body a ``loc`` names, without the union members pydantic tried."""
    return tuple(part for part in loc if not (isinstance(part, str) and _union_member(part)))


def validation_error(exc: ValidationError) -> InvalidParameter:
    """pydantic's complaint as a 400: ``param`` is the top-level field, the message names the exact
    place (``messages[0].role``). pydantic tries each type of a union and reports each: the one that
    reached deepest into the body says what is wrong (a content part of an unknown type, not "a
    valid string"), with every value its alternatives would take there ("'text' or 'image_url'")."""
    errors = exc.errors()
    top = _place(errors[0]["loc"])[:1]  # (the first field with a complaint: one a client sent wrong ...)
    errors = [error for error in errors if _place(error["loc"])[:1] == top]
    deepest = max(len(_place(error["loc"])) for error in errors)  # (... and its deepest complaint)
    first = next(error for error in errors if len(_place(error["loc"])) == deepest)
    place = _place(first["loc"])
    path = ""
    for part in place:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    param = path.split("[")[0].split(".")[0] or None
    if first["type"] == "missing":
        return InvalidParameter(f"missing required parameter: {path!r}", param=param)
    message = re.sub(r" or instance of \w+", "", first["msg"])  # (our model classes are no help to a client)
    if first["type"] == "literal_error":
        expected = [
            str(error.get("ctx", {}).get("expected"))
            for error in errors
            if error["type"] == "literal_error" and _place(error["loc"]) == place
        ]
        message = "Input should be " + " or ".join(dict.fromkeys(expected))
    return InvalidParameter(f"invalid value for {path!r}: {message}" if path else message, param=param)


def parse_body(model: type[Body], body: Any) -> Body:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
