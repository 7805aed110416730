"""Model store: names clients may use, extra models from the settings, and the assembled base model."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import mediaserver.asr.models as models
from mediaserver.asr.models import (
    WIS_SIZES,
    ModelRegistry,
    _base_parts,
    _hf_cached_path,
    assemble_base_model,
    bundled_tiny_en_dir,
)
from mediaserver.config import DEFAULT_MODEL_ALIASES, Settings
from mediaserver.errors import ModelUnavailable, UnknownModel

_tiny_en = bundled_tiny_en_dir()
BASE_PARTS = _base_parts()
assert _tiny_en is not None and BASE_PARTS is not None, "the bundled model packages are dependencies"
TINY_EN: Path = _tiny_en


@pytest.fixture(autouse=True)
def empty_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test sees an empty Hugging Face cache, so it runs the same on a machine that has
    downloaded models (the developer's) as on a fresh one (CI)."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def fake_cached_snapshot(cache: Path, repo: str, model_dir: Path) -> Path:
    """Lay out ``model_dir`` as the Hugging Face cache keeps a downloaded repo (refs/main → snapshot)."""
    revision = "0" * 40
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for item in model_dir.iterdir():
        (snapshot / item.name).symlink_to(item)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(revision)
    return snapshot


def settings(tmp_path: Path, **overrides: Any) -> Settings:
    return Settings(_env_file=None, model_cache_dir=tmp_path / "models", **overrides)


@pytest.fixture
def registry(tmp_path: Path) -> ModelRegistry:
    return ModelRegistry(settings(tmp_path))


def systran_cached(size: str) -> bool:
    return _hf_cached_path(models._WIS_HF_REPOS[size]) is not None


def sha256_of(paths: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(4 * 1024 * 1024):
                digest.update(block)
    return digest.hexdigest()


# --- resolve ------------------------------------------------------------------------------------


def test_bundled_models_are_known(registry: ModelRegistry) -> None:
    assert sorted(registry.names()) == ["base", "tiny.en"]
    kinds = {s.name: (s.kind, s.multilingual) for s in registry.sources()}
    assert kinds == {"tiny.en": ("bundled", False), "base": ("bundled", True)}


@pytest.mark.parametrize("requested", [None, "", "   "])
def test_empty_request_is_the_default_model(registry: ModelRegistry, requested: str | None) -> None:
    assert registry.resolve(requested) == "tiny.en"


def test_default_follows_settings(tmp_path: Path) -> None:
    registry = ModelRegistry(settings(tmp_path, asr_default_model="base"))
    assert registry.resolve(None) == "base"
    assert registry.resolve("whisper-1") == "base"


@pytest.mark.parametrize("alias", [*DEFAULT_MODEL_ALIASES, "@default"])
def test_openai_aliases_are_the_default_model(registry: ModelRegistry, alias: str) -> None:
    assert registry.resolve(alias) == "tiny.en"


@pytest.mark.parametrize("name", ["tiny.en", "base", " base "])
def test_installed_models_are_themselves(registry: ModelRegistry, name: str) -> None:
    assert registry.resolve(name) == name.strip()
    assert registry.source(name).name == name.strip()


@pytest.mark.parametrize(
    ("size", "closest"), [("tiny", "tiny.en"), ("small", "base"), ("medium", "base"), ("large", "base")]
)
def test_wis_sizes_fall_back_to_the_closest_installed(registry: ModelRegistry, size: str, closest: str) -> None:
    assert not systran_cached(size)
    assert registry.resolve(size) == closest


def test_a_wis_size_in_the_hugging_face_cache_is_used(tmp_path: Path, empty_hf_cache: Path) -> None:
    repo = models._WIS_HF_REPOS["tiny"]
    snapshot = fake_cached_snapshot(empty_hf_cache, repo, TINY_EN)
    registry = ModelRegistry(settings(tmp_path))
    assert registry.resolve("tiny") == repo
    assert Path(registry.materialize(repo)).resolve() == snapshot.resolve()
    assert registry.is_multilingual(repo) is False  # read from its vocabulary, not its name


def test_wis_base_is_the_bundled_base(registry: ModelRegistry) -> None:
    assert registry.resolve("base") == "base"


@pytest.mark.parametrize("size", ["tiny", "small", "medium", "large"])
def test_wis_sizes_without_fallback_are_unknown(tmp_path: Path, size: str) -> None:
    assert not systran_cached(size)
    registry = ModelRegistry(settings(tmp_path, wis_size_fallback=False))
    with pytest.raises(UnknownModel) as info:
        registry.resolve(size)
    assert "available models: base, tiny.en" in info.value.message
    assert repr(size) in info.value.message


@pytest.mark.parametrize("name", ["whisper-2", "tiny.en.v2", "TINY.EN", "large-v3", "distil-large-v3"])
def test_unknown_name(registry: ModelRegistry, name: str) -> None:
    with pytest.raises(UnknownModel) as info:
        registry.resolve(name)
    error = info.value
    assert error.status == 400 and error.code == "model_not_found" and error.param == "model"
    assert "available models: base, tiny.en" in error.message
    assert repr(name) in error.message


@pytest.mark.parametrize(
    "name",
    [
        "/etc",
        "../models",
        "./",
        "~",
        "/",
        "Systran/faster-whisper-small",  # a repo id no one configured: would start a download
        "openai/whisper-large-v3",
    ],
)
def test_clients_cannot_name_paths_or_repos(registry: ModelRegistry, name: str) -> None:
    with pytest.raises(UnknownModel):
        registry.resolve(name)
    assert name not in registry.names()


def test_clients_cannot_name_a_real_model_directory(registry: ModelRegistry) -> None:
    assert TINY_EN is not None
    for name in (str(TINY_EN), str(TINY_EN) + "/", os.path.relpath(TINY_EN)):
        with pytest.raises(UnknownModel):
            registry.resolve(name)


# --- extra models -------------------------------------------------------------------------------


def test_extra_model_local_directory(tmp_path: Path) -> None:
    assert TINY_EN is not None
    registry = ModelRegistry(settings(tmp_path, asr_extra_models={"mine": str(TINY_EN)}))
    assert registry.resolve("mine") == "mine"
    source = registry.source("mine")
    assert source.kind == "local"
    path = registry.materialize("mine")
    assert Path(path) == TINY_EN.resolve()
    assert (Path(path) / "model.bin").is_file()


def test_extra_model_huggingface_id(tmp_path: Path) -> None:
    repo = "Systran/faster-whisper-small"
    assert _hf_cached_path(repo) is None
    registry = ModelRegistry(settings(tmp_path, asr_extra_models={"whisper-small": repo}, allow_model_download=False))
    assert registry.resolve("whisper-small") == "whisper-small"
    source = registry.source("whisper-small")
    assert (source.kind, source.location) == ("huggingface", repo)
    with pytest.raises(ModelUnavailable) as info:
        registry.materialize("whisper-small")
    assert info.value.status == 503
    assert "'whisper-small'" in info.value.message and "downloads are disabled" in info.value.message


@pytest.mark.parametrize("location", ["not a dir or repo", "/nonexistent/model/dir", "a/b/c", "./relative/dir"])
def test_invalid_extra_model_location(tmp_path: Path, location: str) -> None:
    with pytest.raises(ValueError, match="'broken'"):
        ModelRegistry(settings(tmp_path, asr_extra_models={"broken": location}))


def test_directory_without_model_bin_is_not_a_model(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="neither a CTranslate2 directory"):
        ModelRegistry(settings(tmp_path, asr_extra_models={"x": str(empty)}))


def test_materialize_bundled_tiny_en(registry: ModelRegistry) -> None:
    assert registry.materialize("tiny.en") == str(TINY_EN)


def test_wis_fallback_is_consistent_without_bundled_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A deployment without the bundled packages, serving only its own model of unknown size.
    assert TINY_EN is not None
    monkeypatch.setattr(models, "bundled_tiny_en_dir", lambda: None)
    monkeypatch.setattr(models, "_base_parts", lambda: None)
    registry = ModelRegistry(
        settings(
            tmp_path,
            asr_default_model="custom",
            translation_model="custom",
            asr_preload_models=["custom"],
            asr_extra_models={"custom": str(TINY_EN)},
        )
    )
    assert registry.names() == ["custom"]
    outcomes = set()
    for size in WIS_SIZES:
        try:
            outcomes.add(registry.resolve(size))
        except UnknownModel:
            outcomes.add("UnknownModel")
    assert len(outcomes) == 1, outcomes


# --- the assembled base model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def parts_sha256() -> str:
    assert BASE_PARTS is not None
    return sha256_of(BASE_PARTS)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def no_temp_dirs(cache_dir: Path) -> bool:
    return not [p for p in cache_dir.iterdir() if p.name.startswith(".base-")]


def test_assemble_base_model(cache_dir: Path, parts_sha256: str) -> None:
    assert BASE_PARTS is not None
    part1, part2 = BASE_PARTS
    target = assemble_base_model(cache_dir, progress=False)
    assert target == cache_dir / "base"
    model_bin = target / "model.bin"
    assert model_bin.stat().st_size == part1.stat().st_size + part2.stat().st_size
    assert sha256_of([model_bin]) == parts_sha256
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        assert (target / name).read_bytes() == (part1.parent / name).read_bytes(), name
    assert no_temp_dirs(cache_dir)


def test_assemble_again_does_not_rewrite(cache_dir: Path) -> None:
    target = assemble_base_model(cache_dir, progress=False)
    before = (target / "model.bin").stat()
    again = assemble_base_model(cache_dir, progress=False)
    after = (again / "model.bin").stat()
    assert again == target
    assert (after.st_mtime_ns, after.st_ino) == (before.st_mtime_ns, before.st_ino)


def test_materialize_base_uses_the_assembled_copy(cache_dir: Path) -> None:
    target = assemble_base_model(cache_dir, progress=False)
    before = (target / "model.bin").stat()
    registry = ModelRegistry(Settings(_env_file=None, model_cache_dir=cache_dir))
    assert registry.materialize(registry.resolve("base")) == str(target)
    after = (target / "model.bin").stat()
    assert (after.st_mtime_ns, after.st_ino) == (before.st_mtime_ns, before.st_ino)


def test_truncated_model_bin_is_rebuilt(cache_dir: Path, parts_sha256: str) -> None:
    target = assemble_base_model(cache_dir, progress=False)
    model_bin = target / "model.bin"
    size = model_bin.stat().st_size
    with open(model_bin, "r+b") as f:
        f.truncate(size // 3)
    rebuilt = assemble_base_model(cache_dir, progress=False)
    assert rebuilt == target
    assert (rebuilt / "model.bin").stat().st_size == size
    assert sha256_of([rebuilt / "model.bin"]) == parts_sha256
    assert no_temp_dirs(cache_dir)


def test_missing_config_is_rebuilt(cache_dir: Path) -> None:
    target = assemble_base_model(cache_dir, progress=False)
    (target / "config.json").unlink()
    rebuilt = assemble_base_model(cache_dir, progress=False)
    assert (rebuilt / "config.json").is_file()
    assert no_temp_dirs(cache_dir)


# --- what a model can do ------------------------------------------------------------------------


def test_multilingual_is_one_answer_for_every_kind_of_model(tmp_path: Path) -> None:
    registry = ModelRegistry(
        settings(
            tmp_path,
            asr_extra_models={
                "on-disk": str(TINY_EN),  # read from its vocabulary
                "small-en": "Systran/faster-distil-whisper-small.en",  # not downloaded: from its name
                "medium": "Systran/faster-whisper-medium",
            },
        )
    )
    assert registry.is_multilingual("tiny.en") is False
    assert registry.is_multilingual("base") is True
    assert registry.is_multilingual("whisper-1") is False  # an alias of the default, tiny.en
    assert registry.is_multilingual("on-disk") is False
    assert registry.is_multilingual("small-en") is False
    assert registry.is_multilingual("medium") is True
    registry.learn("medium", False)  # a loaded engine is the authority
    assert registry.is_multilingual("medium") is False
    assert registry.multilingual_names() == ["base"]


def test_an_english_only_model_refuses_what_it_cannot_do(registry: ModelRegistry) -> None:
    from mediaserver.errors import InvalidParameter
    from mediaserver.events import TranscriptionOptions

    registry.check_options("tiny.en", TranscriptionOptions(language="en"))
    registry.check_options("base", TranscriptionOptions(language="de", task="translate"))
    with pytest.raises(InvalidParameter) as translate:
        registry.check_options("tiny.en", TranscriptionOptions(task="translate"))
    assert translate.value.param == "model"
    assert "English-only and cannot translate (multilingual models here: base)" in translate.value.message
    with pytest.raises(InvalidParameter) as german:
        registry.check_options("tiny.en", TranscriptionOptions(language="de"))
    assert german.value.param == "language"
    assert "'de' needs a multilingual model" in german.value.message


def test_translation_falls_back_only_where_the_client_named_no_particular_model(registry: ModelRegistry) -> None:
    assert registry.translation_model("base", fallback=False) == "base"
    assert registry.translation_model("tiny.en", fallback=True) == "base"
    assert registry.translation_model(None, fallback=True) == "base"
    assert registry.translation_model("tiny.en", fallback=False) == "tiny.en"  # check_options refuses it


def test_a_request_naming_no_model_takes_the_multilingual_fallback_for_another_language(
    registry: ModelRegistry,
) -> None:
    """Home Assistant's Wyoming names a language and never a model: the English-only default cannot,
    translation_model can. A model the client named is kept (check_options refuses what it cannot)."""
    from mediaserver.events import TranscriptionOptions

    german, english, auto = (TranscriptionOptions(language=x) for x in ("de", "en", None))
    assert registry.for_options(None, german) == "base"
    assert registry.for_options("whisper-1", german) == "base"  # an OpenAI name names no model of ours
    assert registry.for_options(None, TranscriptionOptions(task="translate")) == "base"
    assert registry.for_options("tiny.en", german) == "tiny.en"
    assert registry.for_options(None, english) is None and registry.for_options(None, auto) is None
    assert registry.for_options("base", german) == "base"


def test_cantonese_is_offered_and_accepted_only_by_a_model_that_has_it(tmp_path: Path) -> None:
    """Whisper's Cantonese token ('yue') came with large-v3 (a vocabulary of 51866): base (51865) has
    99 languages, and 'yue' asked of it decoded English speech as "Wo oh military Navy Navy..." (a
    Home Assistant user trial: Wyoming's info listed it for base). A local model dir with a v3
    vocabulary (the base model's files, one token added) has it."""
    from mediaserver.errors import InvalidParameter
    from mediaserver.events import TranscriptionOptions
    from mediaserver.languages import WHISPER_LANGUAGES

    base = Path(ModelRegistry(settings(tmp_path)).materialize("base"))
    v3 = tmp_path / "v3"
    v3.mkdir()
    for item in base.iterdir():
        (v3 / item.name).symlink_to(item)
    (v3 / "vocabulary.txt").unlink()
    lines = (base / "vocabulary.txt").read_bytes().splitlines(keepends=True)
    assert len(lines) == 51865
    (v3 / "vocabulary.txt").write_bytes(b"".join(lines) + b"<|yue|>\n")
    registry = ModelRegistry(settings(tmp_path, asr_extra_models={"v3": str(v3)}))
    assert registry.languages("tiny.en") == ["en"]
    assert "yue" not in registry.languages("base") and len(registry.languages("base")) == 99
    assert registry.languages("v3") == list(WHISPER_LANGUAGES) and len(WHISPER_LANGUAGES) == 100
    registry.check_options("base", TranscriptionOptions(language="de"))
    registry.check_options("v3", TranscriptionOptions(language="yue"))
    with pytest.raises(InvalidParameter) as refused:
        registry.check_options("base", TranscriptionOptions(language="yue"))
    assert refused.value.param == "language" and "have it: v3" in refused.value.message
    # A request naming no model (Home Assistant's) goes to one that has it; one naming base does not.
    assert registry.for_options(None, TranscriptionOptions(language="yue")) == "v3"
    assert registry.for_options("base", TranscriptionOptions(language="yue")) == "base"
    # What the converter writes now: vocabulary.json (a review: only vocabulary.txt was read).
    v3_json = tmp_path / "v3json"
    v3_json.mkdir()
    for item in v3.iterdir():
        if item.name != "vocabulary.txt":
            (v3_json / item.name).symlink_to(item.resolve())
    tokens = [line.rstrip(b"\n").decode() for line in lines] + ["<|yue|>"]
    (v3_json / "vocabulary.json").write_text(json.dumps(tokens))
    with_json = ModelRegistry(settings(tmp_path, asr_extra_models={"mine": str(v3_json)}))
    assert with_json.has_cantonese("mine") and "yue" in with_json.languages("mine")
