"""Fixtures of the echo tests (test_echo.py, test_echo_auto.py): Piper answers as the far end and a
real human recording (tests/human_speech.py) as the near end."""

from __future__ import annotations

import numpy as np
import pytest

from tests import echo_room as room
from tests.conftest import synthesize
from tests.echo_room import Audio
from tests.human_speech import default_dir, load_clips

ANSWERS = (
    "The weather in Paris today is sunny with a high of twenty two degrees.",
    "I have set a timer for ten minutes. Let me know if you need anything else.",
    "The capital of Australia is Canberra, not Sydney as many people think.",
)


@pytest.fixture(scope="module")
def answers() -> list[Audio]:
    return [synthesize(text).audio16k.astype(np.float32) for text in ANSWERS]


@pytest.fixture(scope="module")
def person() -> Audio:
    _, audio, _ = load_clips(default_dir(), ["librivox_0870"])[0]
    return (audio / room.rms(audio) * 0.07).astype(np.float32)
