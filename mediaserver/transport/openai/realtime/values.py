"""Realtime client events' values: the checks every event's fields go through, each failing with
an ``EventError`` that names the parameter in OpenAI's words, and the ids the session mints."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:22]}"


class EventError(Exception):
    """A client event that cannot be applied; becomes an ``error`` event, the session stays open."""

    def __init__(self, code: str, message: str, param: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.kind = kind


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def as_object(value: object, param: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected an object, but got {type_name(value)}.", param
        )
    return value


def as_bool(value: object, param: str) -> bool:
    if not isinstance(value, bool):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected a boolean, but got {type_name(value)}.", param
        )
    return value


def optional_str(value: object, param: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise EventError(
        "invalid_type", f"Invalid type for '{param}': expected a string, but got {type_name(value)}.", param
    )


def number(value: object, param: str, minimum: float, maximum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected a number, but got {type_name(value)}.", param
        )
    if not minimum <= value <= maximum:
        raise EventError(
            "invalid_value", f"Invalid '{param}': {value}. Expected a value from {minimum} to {maximum}.", param
        )
    return float(value)


def integer(value: object, param: str, minimum: int, maximum: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected an integer, but got {type_name(value)}.", param
        )
    if value < minimum:
        raise EventError("integer_below_min_value", f"Invalid '{param}': {value}. Minimum is {minimum}.", param)
    if value > maximum:
        raise EventError("integer_above_max_value", f"Invalid '{param}': {value}. Maximum is {maximum}.", param)
    return value


def known_fields(value: object, allowed: frozenset[str], param: str) -> Mapping[str, Any]:
    """``value`` as an object (``as_object``) when every key of it is in ``allowed``; else OpenAI's
    ``unknown_parameter`` naming the first that is not (a typo such as ``turn_detecton`` was taken
    silently, and the setting it meant kept its old value: a Realtime trial). Only for the small
    objects whose fields OpenAI fixed (the input and output audio, turn detection, transcription,
    formats); a session's top level takes what it does not know, as newer OpenAI fields may come
    from newer clients."""
    spec = as_object(value, param)
    for key in spec:
        if key not in allowed:
            raise EventError("unknown_parameter", f"Unknown parameter: '{param}.{key}'.", f"{param}.{key}")
    return spec
