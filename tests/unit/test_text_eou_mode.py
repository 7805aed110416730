"""turn_text_model's modes (turns/text_eou.py): which default LLM model the text scorer asks, and
which engine gets the scorer's own slot (llm/service.py), without starting an engine."""

from __future__ import annotations

import logging

import pytest

from mediaserver.config import Settings
from mediaserver.llm.registry import BUNDLED_NAME, bundled_gguf
from mediaserver.llm.service import LlmService
from mediaserver.metrics import Metrics
from mediaserver.turns.text_eou import text_eou_of


def scorer_for(caplog: pytest.LogCaptureFixture, **update: object) -> tuple[dict[str, object], list[str]]:
    settings = Settings(_env_file=None, **update)  # type: ignore[arg-type]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mediaserver.turns.text_eou"):
        scorer = text_eou_of(settings, LlmService(settings, Metrics()))
    assert scorer is not None
    return scorer.status(), [f"{r.levelname} {r.getMessage()}" for r in caplog.records]


def test_auto_is_the_default_and_runs_on_the_bundled_model(caplog: pytest.LogCaptureFixture) -> None:
    status, logged = scorer_for(caplog)
    assert Settings(_env_file=None).turn_text_model == "auto"
    assert status == {"text_model": "auto", "text_model_in_force": "llm"}, status
    assert logged == []


def test_auto_leaves_another_local_model_to_the_rule_quietly_and_llm_uses_it(caplog: pytest.LogCaptureFixture) -> None:
    """The threshold was measured on the bundled SmolLM2 only: auto does not guess for another model
    (said at INFO, in /health), turn_text_model llm asks it all the same."""
    gguf = bundled_gguf()
    assert gguf is not None
    other = {"llm_extra_models": {"my-model": str(gguf)}, "llm_model": "my-model"}
    status, logged = scorer_for(caplog, **other)
    assert status["text_model_in_force"] == "off" and "not the bundled" in str(status["text_model_problem"]), status
    assert len(logged) == 1 and logged[0].startswith("INFO turn_text_model auto is off"), logged
    status, logged = scorer_for(caplog, turn_text_model="llm", **other)
    assert status == {"text_model": "llm", "text_model_in_force": "llm"}, status
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mediaserver.turns.text_eou"):
        off = text_eou_of(Settings(_env_file=None, turn_text_model="llm"), None)  # the LLM is off
    assert off is not None and not off.in_force
    assert [r.levelname for r in caplog.records] == ["WARNING"], caplog.records


def test_off_has_no_scorer() -> None:
    settings = Settings(_env_file=None, turn_text_model="off")
    assert text_eou_of(settings, LlmService(settings, Metrics())) is None
    assert LlmService(settings, Metrics()).sources.default_name == BUNDLED_NAME
