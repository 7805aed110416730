"""Which features this server runs: ASR, TTS and the LLM, decided once at start-up.

As the Willow Inference Server does it: on CUDA the features share one GPU's memory, so they are
enabled in order of importance, ASR, then TTS, then the LLM, each only while the free VRAM still
covers what it needs (``vram_*_mb`` settings). On the CPU memory is not the limit: every feature
that is installed and not switched off in settings is on. The decision is logged and shown in
``/health``; a request for a disabled feature gets a 503 that names the reason, never a 404.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from mediaserver.devices import DeviceChoice
from mediaserver.errors import ApiError

log = logging.getLogger(__name__)

FEATURE_ORDER: tuple[str, ...] = ("asr", "tts", "llm")


class FeatureDisabled(ApiError):
    status = 503
    code = "feature_disabled"


@dataclass(frozen=True)
class Feature:
    name: str
    enabled: bool
    reason: str


@dataclass(frozen=True)
class FeatureRequest:
    """What the decision needs to know of one feature.

    ``unavailable`` is None when the feature can run here, else why not (package not installed,
    no model resolves, switched off in settings). ``vram_mb`` is what it needs on a GPU. A
    ``required`` feature (ASR, the server's core) is on even when the VRAM looks short; the reason
    then says so.
    """

    name: str
    unavailable: str | None
    vram_mb: int
    required: bool = False


class Capabilities:
    """The features of this server, as decided at start-up."""

    def __init__(self, features: Mapping[str, Feature]) -> None:
        self._features = dict(features)

    def enabled(self, name: str) -> bool:
        feature = self._features.get(name)
        return feature is not None and feature.enabled

    def reason(self, name: str) -> str:
        feature = self._features.get(name)
        return feature.reason if feature is not None else f"{name} is not part of this server"

    def require(self, name: str) -> None:
        """Raise a 503 naming why ``name`` is off; return when it is on."""
        if not self.enabled(name):
            raise FeatureDisabled(f"{name.upper()} is disabled on this server: {self.reason(name)}")

    def set(self, feature: Feature) -> None:
        """Record a later change (a model that failed to load turns its feature off)."""
        self._features[feature.name] = feature

    def as_dict(self) -> dict[str, dict[str, bool | str]]:
        return {name: {"enabled": f.enabled, "reason": f.reason} for name, f in self._features.items()}


def free_vram_bytes(device_index: int) -> int | None:
    """Free memory of one GPU through NVML; None when it cannot be read."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)
    except Exception as exc:
        log.warning("NVML free-memory query failed: %s", exc)
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def decide(
    device: DeviceChoice,
    requests: list[FeatureRequest],
    *,
    free_vram: int | None = None,
) -> Capabilities:
    """Enable features in ``FEATURE_ORDER``; on CUDA each takes its VRAM from what is left.

    ``free_vram`` is read from NVML (first GPU in use) when not given.
    """
    ordered = sorted(requests, key=lambda r: FEATURE_ORDER.index(r.name) if r.name in FEATURE_ORDER else 99)
    features: dict[str, Feature] = {}
    if device.device == "cuda" and free_vram is None:
        free_vram = free_vram_bytes(device.device_index[0])
    left_mb = free_vram // (1024 * 1024) if free_vram is not None else None
    for request in ordered:
        if request.unavailable is not None:
            features[request.name] = Feature(request.name, False, request.unavailable)
        elif device.device != "cuda":
            features[request.name] = Feature(request.name, True, "CPU: every installed feature is on")
        elif left_mb is None:
            features[request.name] = Feature(request.name, True, "CUDA: free VRAM unknown, enabled")
        elif request.vram_mb <= left_mb or request.required:
            short = "" if request.vram_mb <= left_mb else " (short: it may not fit)"
            features[request.name] = Feature(
                request.name, True, f"CUDA: needs {request.vram_mb} MB of VRAM, {left_mb} MB were free{short}"
            )
            left_mb = max(0, left_mb - request.vram_mb)
        else:
            before = ", ".join(n.upper() for n, f in features.items() if f.enabled)
            after = f" after {before}" if before else ""
            features[request.name] = Feature(
                request.name, False, f"not enough free VRAM: needs {request.vram_mb} MB, {left_mb} MB left{after}"
            )
    for feature in features.values():
        # Off for any reason but the operator's own switch (a model path that does not exist, no
        # binary, too little VRAM) is what the operator must hear of: a WARNING, not an INFO line.
        chosen = feature.enabled or feature.reason.startswith("switched off in settings")
        log.log(
            logging.INFO if chosen else logging.WARNING,
            "feature %s: %s (%s)",
            feature.name,
            "on" if feature.enabled else "off",
            feature.reason,
        )
    return Capabilities(features)
