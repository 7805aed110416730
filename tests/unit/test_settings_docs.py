"""The settings tables of README.md and docs/*.md against the code (``Settings``, ``RemoteModel``).

Every name in a settings table (``| setting | default | |``) is a setting, with the default the code
has (the docs site's configuration page lists every setting; it is generated from the code, see
tests/unit/test_docs_site.py); the ``remote_models`` field table of docs/scaling.md is held to
``RemoteModel`` the same way; every ``MEDIASERVER_*`` variable the docs name is read by the server;
a default given in prose right after a setting's name (```stream_gap_fill_ms` (120 ms)``) is the
code's. Defaults are compared as values (``7`` = ``7.0``, ``100 MiB`` = 104857600, JSON lists and maps,
paths with ``~``); a default the docs describe in words instead of a value is listed in ``DERIVED``
with the value it stands for, so that wording is held to the code too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic.fields import FieldInfo

from mediaserver.config import (
    DEFAULT_EMBEDDING_ALIASES,
    DEFAULT_LLM_ALIASES,
    DEFAULT_MODEL_ALIASES,
    DEFAULT_VOICE_ALIASES,
    OPENAI_VOICES,
    PIPER_VOICE_URL,
    WIS_SPEAKERS,
    RemoteModel,
    Settings,
)
from mediaserver.config.environment import NOT_SETTINGS, PREFIX, setting_names
from mediaserver.speakers import service as speakers
from mediaserver.turns.fetch import default_path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETTINGS = Settings.model_fields

# Defaults the tables give in words, by setting: (the words, the value they stand for).
DERIVED: dict[str, tuple[str, object]] = {
    "static_dir": ("`static/` of the checkout", ROOT / "static"),
    "llm_model": ("bundled SmolLM2", ""),
    "llm_threads": ("half the cores", 0),
    "llm_engine_binary": ("the one `make setup` built", None),
    "llm_embedding_model": ("the chat GGUF", ""),
    "assistant_voice": ("TTS default", None),
    "assistant_llm_model": ("LLM default", None),
    "assistant_temperature": ("the model's", None),
    "tts_voice_aliases": ("OpenAI and WIS names → `@default`", DEFAULT_VOICE_ALIASES),
    "tts_download_url": ("piper-voices", PIPER_VOICE_URL),
    "wyoming_allowed_networks": ("any", []),
    "realtime_client_secret_key": ("random per process", None),
    # None: the model's cache path, the one mediaserver.turns.fetch writes (checked below).
    "turn_model_path": ("`~/.cache/mediaserver/turn/smart-turn-v3.2-cpu.onnx`", None),
    "speaker_model_path": ("`~/.cache/mediaserver/speaker/pretrained.pt`", None),
    "speakers_dir": ("`~/.cache/mediaserver/speakers`", None),
    "asr_model_aliases": ("OpenAI's transcription model names → `@default`", DEFAULT_MODEL_ALIASES),
    "llm_model_aliases": ("OpenAI's chat model names → `@default`", DEFAULT_LLM_ALIASES),
    "llm_embedding_aliases": ("OpenAI's embedding model names → `@embedding`", DEFAULT_EMBEDDING_ALIASES),
}
# remote_models' fields (docs/scaling.md): ``model`` empty means a name per backend.
REMOTE_DERIVED: dict[str, tuple[str, object]] = {"model": ("`infer_bls` / `whisper-1`", "")}
# Words for "no value": None or an empty list or map.
NOTHING = {"none", "off", "unset"}
UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "days": 86400, "day": 86400}
# MEDIASERVER_ names the docs give as what is *not* a setting (the warning's example).
NOT_SETTINGS_IN_DOCS = {"MEDIASERVER_PORT"}


@dataclass(frozen=True)
class Row:
    where: str  # file:line
    names: list[str]
    defaults: list[str] | None  # None: the row only points elsewhere (an empty default cell)


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside backticks, quotes and brackets."""
    parts, depth, quoted, current = [], 0, "", ""
    for char in text:
        if quoted:
            quoted = "" if char == quoted else quoted
        elif char in '`"':
            quoted = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == sep and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    parts.append(current)
    return [part.strip() for part in parts]


def tables(path: Path, header: str) -> Iterator[Row]:
    """The rows of ``path``'s tables whose first two header cells are ``header`` and ``default``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    inside = False
    for number, line in enumerate(lines, 1):
        if not line.startswith("|"):
            inside = False
            continue
        cells = _split(line.strip().strip("|"), "|")
        if cells[:2] == [header, "default"]:
            inside = True
            continue
        if not inside or set(cells[0]) <= set("-: "):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        assert names and not re.sub(r"`[^`]+`|,|\band\b", "", cells[0]).strip(), (
            f"{path.name}:{number}: the first cell names settings in backticks, got {cells[0]!r}"
        )
        defaults = None if not cells[1] else [cells[1]] if len(names) == 1 else _split(cells[1], ",")
        yield Row(f"{path.relative_to(ROOT)}:{number}", names, defaults)


def expand(names: list[str], fields: Mapping[str, FieldInfo], where: str) -> list[str]:
    """``_max_ttl_s`` after ``realtime_client_secret_default_ttl_s`` is ``realtime_client_secret_max_ttl_s``."""
    expanded: list[str] = []
    for name in names:
        if name.startswith("_"):
            first = expanded[0]
            stems = [first[:i] for i, char in enumerate(first) if char == "_" and first[:i] + name in fields]
            assert stems, f"{where}: {name!r} after {first!r} names no setting"
            name = stems[-1] + name
        expanded.append(name)
    return expanded


def value_of(text: str) -> object:
    """A table's default as a value, or the text itself (a string, or words to match exactly)."""
    text = re.sub(r"\s*\([^()]*\)$", "", text).strip()  # a remark in parentheses after the value
    if text.startswith("`") and text.endswith("`") and text.count("`") == 2:
        text = text[1:-1]
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    number = re.fullmatch(r"(-?\d+(?:\.\d+)?)(?:\s*(KiB|MiB|GiB|days?))?", text)
    if number:
        value = float(number[1]) * UNITS.get(number[2] or "", 1)
        return int(value) if value.is_integer() else value
    if text.startswith(("[", "{")):
        return json.loads(text)
    return text


def agrees(text: str, default: object, derived: tuple[str, object] | None) -> bool:
    """Whether a table's default ``text`` says the code's ``default``."""
    if derived is not None:
        return text == derived[0] and default == derived[1]
    value = value_of(text)
    if isinstance(value, str) and value.lower() in NOTHING:
        return default is None or default == [] or default == {}
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    if isinstance(default, int | float):
        return isinstance(value, int | float) and value == default
    if isinstance(default, Path):
        return isinstance(value, str) and Path(value.rstrip("/")).expanduser() == default
    if isinstance(default, list) and isinstance(value, str):  # a list written as words: a, an, the
        return [value_of(part) for part in _split(value, ",")] == default
    if isinstance(default, str) and isinstance(value, str) and value.startswith('"'):
        quoted = value.strip('"')
        return default.startswith(quoted[:-1]) if quoted.endswith("…") else default == quoted
    return value == default


def default_of(field: FieldInfo) -> object:
    return field.get_default(call_default_factory=True)


def documented(header: str, fields: Mapping[str, FieldInfo], paths: list[Path]) -> dict[str, list[tuple[str, str]]]:
    """Each documented name: its (where, default text) pairs; the rows that only point elsewhere as ''."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path in paths:
        for row in tables(path, header):
            if row.names == ["assistant_*"] and row.defaults is None:  # docs/realtime.md points at the voice loop's
                continue
            names = expand(row.names, fields, row.where)
            defaults = row.defaults
            if defaults is not None and len(defaults) == 1 < len(names):
                defaults = defaults * len(names)  # one default for all: "off", "`{}`"
            assert defaults is None or len(defaults) == len(names), (
                f"{row.where}: {len(names)} settings but {len(defaults)} defaults: {defaults}"
            )
            for i, name in enumerate(names):
                found.setdefault(name, []).append((row.where, "" if defaults is None else defaults[i]))
    return found


def test_derived_defaults_stand_for_what_the_code_does() -> None:
    assert default_path() == Path("~/.cache/mediaserver/turn/smart-turn-v3.2-cpu.onnx").expanduser()
    assert speakers.model_path(Settings()) == Path("~/.cache/mediaserver/speaker/pretrained.pt").expanduser()
    assert speakers.store_dir(Settings()) == Path("~/.cache/mediaserver/speakers").expanduser()
    assert set(DEFAULT_VOICE_ALIASES) == {*OPENAI_VOICES, *WIS_SPEAKERS}
    assert set(DEFAULT_VOICE_ALIASES.values()) == {"@default"}
    for aliases, target, prefixes in [
        (DEFAULT_MODEL_ALIASES, "@default", ("gpt-", "whisper-")),
        (DEFAULT_LLM_ALIASES, "@default", ("gpt-",)),
        (DEFAULT_EMBEDDING_ALIASES, "@embedding", ("text-embedding-",)),
    ]:
        assert aliases and set(aliases.values()) == {target}
        assert all(alias.startswith(prefixes) for alias in aliases), aliases


def test_every_setting_in_a_table_is_one_with_its_default() -> None:
    found = documented("setting", SETTINGS, DOCS)
    assert len(found) > 50, "the settings tables were not found: the parsing is broken"
    unknown = sorted(f"{where}: {name}" for name, rows in found.items() for where, _ in rows if name not in SETTINGS)
    assert not unknown, f"in a settings table but not a setting: {unknown}"
    wrong = []
    for name, rows in found.items():
        default = default_of(SETTINGS[name])
        for where, text in rows:
            if text and not agrees(text, default, DERIVED.get(name)):
                wrong.append(f"{where}: {name} says {text!r}, the code has {default!r}")
    assert not wrong, "\n".join(wrong)


def test_the_remote_models_table_is_remote_model() -> None:
    fields = RemoteModel.model_fields
    found = documented("field", fields, [ROOT / "docs" / "scaling.md"])
    assert set(found) == set(fields)
    wrong = []
    for name, rows in found.items():
        field = fields[name]
        for where, text in rows:
            if field.is_required():
                ok = text == "(required)"
            else:
                ok = agrees(text, default_of(field), REMOTE_DERIVED.get(name))
            if not ok:
                wrong.append(f"{where}: {name} says {text!r}, the code has {field.get_default()!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", [*DOCS, ROOT / "tools" / "README.md", ROOT / "deploy" / "docker-compose.yml"])
def test_every_environment_variable_the_docs_name_is_read(path: Path) -> None:
    known = setting_names(SETTINGS)
    named = set(re.findall(r"\b(MEDIASERVER_[A-Z0-9_]*[A-Z0-9])\b", path.read_text(encoding="utf-8")))
    unread = sorted(
        v for v in named - NOT_SETTINGS - NOT_SETTINGS_IN_DOCS if v.removeprefix(PREFIX).lower() not in known
    )
    assert not unread, f"{path.name} names variables no setting reads: {unread}"


# In prose: `setting` or `MEDIASERVER_SETTING`, then in parentheses its default, a number with an
# optional unit or (after "default") a value in backticks, alone up to the first , ; : or the end.
PROSE_DEFAULT = re.compile(
    r"`(?:MEDIASERVER_)?([A-Za-z][A-Za-z0-9_]*)`,? \((?:default )?"
    r"(-?\d+(?:\.\d+)?(?: ?(?:ms|s|KiB|MiB|days?))?|(?<=default )`[^`]+`)(?=[,;:)])"
)


def prose_seconds(name: str, text: str) -> float | None:
    """A duration written in prose, in the setting's own unit (``500 ms`` of a ``_s`` setting is 0.5)."""
    number = re.fullmatch(r"(-?\d+(?:\.\d+)?) ?(ms|s)", text)
    if number is None:
        return None
    value = float(number[1])
    if number[2] == "ms" and not name.endswith("_ms"):
        value /= 1000
    if number[2] == "s" and name.endswith("_ms"):
        value *= 1000
    return value


@pytest.mark.parametrize("path", [*DOCS, ROOT / "tools" / "README.md"])
def test_defaults_given_in_prose_are_the_code_s(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    wrong = []
    for match in PROSE_DEFAULT.finditer(text):
        name = match[1].lower()
        if name not in SETTINGS:
            continue
        seconds, default = prose_seconds(name, match[2]), default_of(SETTINGS[name])
        if not (agrees(match[2], default, None) if seconds is None else seconds == default):
            line = text.count("\n", 0, match.start()) + 1
            wrong.append(f"{path.name}:{line}: {match[0]!r}, the code has {default!r}")
    assert not wrong, "\n".join(wrong)
