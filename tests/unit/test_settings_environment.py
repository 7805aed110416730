"""Unknown ``MEDIASERVER_*`` environment variables get a warning naming the closest setting."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mediaserver.config import Settings
from mediaserver.config.environment import unknown_variables, warn_unknown_in_dotenv, warn_unknown_variables

FIELDS = Settings.model_fields


def test_typos_and_non_settings_are_named_with_the_closest_setting() -> None:
    environ = {
        "MEDIASERVER_PORT": "19555",
        "MEDIASERVER_WYOMNG_PORT": "1",
        "mediaserver_qqqqqqqqqqqq": "x",
        "MEDIASERVER_HTTP_PORT": "19002",  # a setting
        "mediaserver_http_port": "19002",  # case-insensitive, as the settings are read
        "PATH": "/usr/bin",  # not ours
    }
    assert unknown_variables(environ, FIELDS) == [
        ("MEDIASERVER_PORT", "http_port"),
        ("MEDIASERVER_WYOMNG_PORT", "wyoming_port"),
        ("mediaserver_qqqqqqqqqqqq", None),
    ]


def test_old_names_of_renamed_settings_and_tool_variables_are_known() -> None:
    environ = {
        "MEDIASERVER_DEFAULT_MODEL": "base",  # asr_default_model's old name (AliasChoices)
        "MEDIASERVER_PRELOAD_MODELS": '["base"]',
        "MEDIASERVER_MODEL_ALIASES": "{}",
        "MEDIASERVER_EXTRA_MODELS": "{}",
        "MEDIASERVER_ASR_DEFAULT_MODEL": "base",
        "MEDIASERVER_API_KEY": "k",  # mint_secret's, not the server's
        "MEDIASERVER_TEST_TRITON_PYTHON": "/usr/bin/python3",
    }
    assert unknown_variables(environ, FIELDS) == []


def test_every_field_is_known() -> None:
    environ = {f"MEDIASERVER_{name.upper()}": "" for name in FIELDS}
    assert unknown_variables(environ, FIELDS) == []


def test_one_warning_per_variable_and_settings_still_load(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    environ = {"MEDIASERVER_PORT": "19555", "MEDIASERVER_WYOMNG_PORT": "1", "MEDIASERVER_HTTP_PORT": "19002"}
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)  # the unknown ones are ignored, not a failure
    assert settings.http_port == 19002 and settings.wyoming_port == 10300
    with caplog.at_level(logging.WARNING, logger="mediaserver.config"):
        warn_unknown_variables(environ, FIELDS)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "MEDIASERVER_PORT" in warnings[0] and "MEDIASERVER_HTTP_PORT" in warnings[0]
    assert "MEDIASERVER_WYOMNG_PORT" in warnings[1] and "MEDIASERVER_WYOMING_PORT" in warnings[1]


def test_a_removed_setting_is_named_as_removed_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"MEDIASERVER_VAD_FRAME_MS": "10", "MEDIASERVER_PORT": "1"}
    assert "vad_frame_ms" not in FIELDS
    assert unknown_variables(environ, FIELDS) == [("MEDIASERVER_PORT", "http_port")]  # not a typo
    with caplog.at_level(logging.WARNING, logger="mediaserver.config"):
        warnings = warn_unknown_variables(environ, FIELDS)
    assert len(warnings) == 2 and [r.getMessage() for r in caplog.records] == warnings
    assert "MEDIASERVER_VAD_FRAME_MS was removed and its value is ignored" in warnings[0]
    assert "30 ms" in warnings[0]


def test_a_typo_in_the_dotenv_file_is_named_too(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("MEDIASERVER_API_KEYS='[\"k\"]'\nMEDIASERVER_HTTP_PROT=5\n# a comment\nOTHER=1\n")
    with caplog.at_level(logging.WARNING, logger="mediaserver.config"):
        warnings = warn_unknown_in_dotenv(dotenv, FIELDS)
    assert len(warnings) == 1, warnings
    assert f"the variable in {dotenv} MEDIASERVER_HTTP_PROT is not a setting" in warnings[0]
    assert "MEDIASERVER_HTTP_PORT" in warnings[0]
    assert warn_unknown_in_dotenv(tmp_path / "none", FIELDS) == []
