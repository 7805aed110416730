"""Capability gating: which features run, decided from the device and (on CUDA) free VRAM."""

from __future__ import annotations

import logging

import pytest

from mediaserver.app import feature_requests
from mediaserver.capabilities import FeatureDisabled, FeatureRequest, decide
from mediaserver.config import Settings
from mediaserver.devices import GpuInfo, choose_device

MIB = 1024 * 1024
GPU = GpuInfo(0, "Test GPU", (8, 6), 8 * 1024 * MIB)


def requests(llm_missing: str | None = None) -> list[FeatureRequest]:
    # Given out of order on purpose: the decision always goes ASR, TTS, LLM.
    return [
        FeatureRequest("llm", llm_missing, 4000),
        FeatureRequest("asr", None, 1500, required=True),
        FeatureRequest("tts", None, 500),
    ]


def test_cpu_enables_every_installed_feature() -> None:
    caps = decide(choose_device("cpu"), requests())
    assert all(caps.enabled(n) for n in ("asr", "tts", "llm"))
    caps.require("llm")  # no error


def test_cpu_leaves_off_what_is_not_installed_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="mediaserver.capabilities"):
        caps = decide(choose_device("cpu"), requests(llm_missing="llama-cpp-python is not installed"))
    levels = {r.getMessage().split(":")[0]: r.levelno for r in caplog.records}
    # Off for what the operator did not choose is a WARNING (it was an INFO line, an operator trial).
    assert levels == {"feature asr": logging.INFO, "feature tts": logging.INFO, "feature llm": logging.WARNING}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mediaserver.capabilities"):
        decide(choose_device("cpu"), requests(llm_missing="switched off in settings (llm_enabled=false)"))
    assert all(r.levelno == logging.INFO for r in caplog.records)
    assert caps.enabled("tts") and not caps.enabled("llm")
    with pytest.raises(FeatureDisabled) as info:
        caps.require("llm")
    assert info.value.status == 503
    assert "llama-cpp-python is not installed" in info.value.message
    assert caps.as_dict()["llm"] == {"enabled": False, "reason": "llama-cpp-python is not installed"}


@pytest.mark.parametrize(
    ("free_mb", "expected"),
    [
        (8000, {"asr": True, "tts": True, "llm": True}),
        (2500, {"asr": True, "tts": True, "llm": False}),
        (1700, {"asr": True, "tts": False, "llm": False}),
        (500, {"asr": True, "tts": False, "llm": False}),  # ASR is the core: on, with a warning
    ],
)
def test_cuda_enables_in_order_while_vram_lasts(free_mb: int, expected: dict[str, bool]) -> None:
    device = choose_device("auto", gpus=(GPU,), ctranslate2_cuda_count=1, cpu_count=8)
    caps = decide(device, requests(), free_vram=free_mb * MIB)
    assert {n: caps.enabled(n) for n in expected} == expected
    if not expected["llm"]:
        assert "not enough free VRAM: needs 4000 MB" in caps.reason("llm")
    if free_mb < 1500:
        assert "may not fit" in caps.reason("asr")


def test_an_unknown_feature_is_disabled_with_a_reason() -> None:
    caps = decide(choose_device("cpu"), requests())
    assert not caps.enabled("vision")
    with pytest.raises(FeatureDisabled, match="VISION is disabled"):
        caps.require("vision")


def test_vram_asr_mb_and_vram_tts_mb_are_what_asr_and_tts_take() -> None:
    """2500 MB free: with the defaults (1500 + 500) ASR and TTS fit; TTS asking for more, or ASR
    taking more before it, leaves TTS off."""
    device = choose_device("auto", gpus=(GPU,), ctranslate2_cuda_count=1, cpu_count=8)
    free = 2500 * MIB
    assert decide(device, feature_requests(Settings(_env_file=None)), free_vram=free).enabled("tts")
    hungry_tts = decide(device, feature_requests(Settings(_env_file=None, vram_tts_mb=1200)), free_vram=free)
    assert not hungry_tts.enabled("tts") and "needs 1200 MB" in hungry_tts.reason("tts")
    hungry_asr = decide(device, feature_requests(Settings(_env_file=None, vram_asr_mb=2200)), free_vram=free)
    assert hungry_asr.enabled("asr") and "needs 2200 MB" in hungry_asr.reason("asr")
    assert not hungry_asr.enabled("tts") and "300 MB left after ASR" in hungry_asr.reason("tts")
