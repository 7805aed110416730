"""Wake word models: microWakeWord's built-in ones (inside the ``pymicro-wakeword`` wheel) and a
directory of custom ones (``wake_models_dir``).

A model is a microWakeWord JSON config beside its ``.tflite`` file, the format the built-in models
and the models trained for ESPHome use: ``{"type": "micro", "wake_word": "Okay Nabu", "model":
"okay_nabu.tflite", "trained_languages": [...], "micro": {"probability_cutoff": 0.85,
"sliding_window_size": 5, ...}}``. Its name is the ``.tflite`` file's stem. A custom model with a
built-in's name replaces it. A config that cannot be read is logged and skipped, never fatal.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mediaserver.errors import UnknownModel

log = logging.getLogger(__name__)


class UnknownWakeModel(UnknownModel):
    pass


class WakeUnavailable(UnknownModel):
    code = "wake_unavailable"


@dataclass(frozen=True)
class WakeModel:
    """One wake word model: ``name`` (what clients ask for) and the phrase it listens for."""

    name: str
    phrase: str
    tflite_path: Path
    probability_cutoff: float
    sliding_window_size: int
    languages: tuple[str, ...]
    builtin: bool


def _library_dir() -> Path | None:
    try:
        import pymicro_wakeword
    except ImportError:
        return None
    return Path(pymicro_wakeword.__file__).parent


def tflite_library() -> Path | None:
    """The TFLite C library the ``pymicro-wakeword`` wheel ships."""
    base = _library_dir()
    if base is None:
        return None
    return next(iter(sorted((base / "lib").glob("*tensorflowlite_c.*"))), None)


def read_config(path: Path, *, builtin: bool) -> WakeModel:
    """A microWakeWord JSON config → WakeModel; ValueError when it is not one."""
    try:
        config: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict) or config.get("type", "micro") != "micro":
        raise ValueError(f"{path}: not a microWakeWord config (type must be 'micro')")
    micro = config.get("micro")
    model_file = config.get("model")
    phrase = config.get("wake_word")
    if not isinstance(micro, dict) or not isinstance(model_file, str) or not isinstance(phrase, str):
        raise ValueError(f"{path}: needs 'wake_word', 'model' and a 'micro' object")
    tflite = (path.parent / model_file).resolve()
    if tflite.parent != path.parent.resolve() or not tflite.is_file():
        raise ValueError(f"{path}: model file {model_file!r} is not beside the config")
    cutoff = micro.get("probability_cutoff")
    window = micro.get("sliding_window_size")
    if not isinstance(cutoff, int | float) or not 0 < cutoff < 1:
        raise ValueError(f"{path}: micro.probability_cutoff must be between 0 and 1")
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= 100:
        raise ValueError(f"{path}: micro.sliding_window_size must be an integer from 1 to 100")
    languages = config.get("trained_languages") or []
    return WakeModel(
        name=tflite.stem,
        phrase=phrase,
        tflite_path=tflite,
        probability_cutoff=float(cutoff),
        sliding_window_size=window,
        languages=tuple(str(lang) for lang in languages if isinstance(lang, str)),
        builtin=builtin,
    )


class WakeModels:
    """Every wake word model the server offers, by name."""

    def __init__(self, models: dict[str, WakeModel], library: Path | None, problem: str | None = None) -> None:
        self._models = models
        self.library = library
        self.problem = problem  # why there are none, when there are none

    @classmethod
    def load(cls, custom_dir: Path | None = None) -> WakeModels:
        library = tflite_library()
        base = _library_dir()
        if library is None or base is None:
            return cls({}, None, "the pymicro-wakeword package is not installed")
        models: dict[str, WakeModel] = {}
        for path in sorted((base / "models").glob("*.json")):
            try:
                model = read_config(path, builtin=True)
            except ValueError as exc:
                log.warning("wake: built-in model skipped: %s", exc)
                continue
            models[model.name] = model
        if custom_dir is not None:
            if not custom_dir.is_dir():
                log.warning("wake: wake_models_dir %s is not a directory; no custom wake words", custom_dir)
            else:
                for path in sorted(custom_dir.glob("*.json")):
                    try:
                        model = read_config(path, builtin=False)
                    except ValueError as exc:
                        log.warning("wake: custom model skipped: %s", exc)
                        continue
                    models[model.name] = model
                    log.info("wake: custom model %r (%r) from %s", model.name, model.phrase, path)
        return cls(models, library, None if models else "no wake word models were found")

    def names(self) -> list[str]:
        return sorted(self._models)

    def models(self) -> list[WakeModel]:
        return [self._models[name] for name in self.names()]

    def get(self, name: str) -> WakeModel:
        return self._models[name]

    def resolve(self, names: list[str] | None) -> list[WakeModel]:
        """The models named (all of them when ``names`` is empty or None); unknown names raise."""
        if not self._models:
            raise WakeUnavailable(f"wake word detection is unavailable: {self.problem}")
        if not names:
            return self.models()
        unknown = [n for n in names if n not in self._models and _normalize(n) not in self._by_phrase()]
        if unknown:
            raise UnknownWakeModel(
                f"unknown wake word model {', '.join(map(repr, unknown))}; available: {', '.join(self.names())}",
                param="names",
            )
        chosen: dict[str, WakeModel] = {}
        for name in names:
            model = self._models.get(name) or self._by_phrase()[_normalize(name)]
            chosen[model.name] = model
        return list(chosen.values())

    def _by_phrase(self) -> dict[str, WakeModel]:
        """Models by phrase too ("Okay Nabu", "okay nabu"), as some clients name them."""
        return {_normalize(m.phrase): m for m in self._models.values()}


def _normalize(text: str) -> str:
    return "_".join(text.lower().replace("-", " ").split())


@functools.cache
def load_wake_models(custom_dir: Path | None) -> WakeModels:
    """The server's models, read once per directory (the Wyoming server and device streams share them)."""
    return WakeModels.load(custom_dir)
