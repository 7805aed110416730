"""``MEDIASERVER_*`` environment variables that are no setting: a typo or an old name is otherwise
silently ignored (``extra="ignore"``), and the server runs on a default the operator thought they
had changed. The server warns once at start-up, naming the closest real setting; it does not fail
(deployments may carry variables of older versions). The variable of a removed setting
(``REMOVED_SETTINGS``) is still recognised for one release: its warning says the setting is gone,
why, and that its value is ignored."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import AliasChoices
from pydantic.fields import FieldInfo

log = logging.getLogger("mediaserver.config")

PREFIX = "MEDIASERVER_"

# Variables of this project that are not server settings: read by its tools and tests.
NOT_SETTINGS = frozenset(
    {
        "MEDIASERVER_API_KEY",  # mint_secret's key (the server's own keys are api_keys)
        "MEDIASERVER_CHROMIUM",  # tests/e2e: the browser to drive
        "MEDIASERVER_SPEECH_DIR",  # tests and tools: where the recorded speech corpus is
        "MEDIASERVER_TEST_TRITON_PYTHON",  # tests: the interpreter of the Triton venv
    }
)

# Settings removed (nobody had a reason to change them), by their former name: why, and what runs
# instead. Kept for one release after the removal (0.1.x), then dropped from this list.
REMOVED_SETTINGS: dict[str, str] = {
    "vad_frame_ms": "the ASR silence gate always reads webrtcvad's 30 ms frames (vad_min_speech_ms and "
    "vad_aggressiveness still tune it)",
}


def setting_names(fields: Mapping[str, FieldInfo]) -> set[str]:
    """Every name a setting is read from, lower case, without the prefix: the field names and the
    old names of renamed settings (their ``AliasChoices``)."""
    names = set(fields)
    for field in fields.values():
        alias = field.validation_alias
        choices: Iterable[object] = alias.choices if isinstance(alias, AliasChoices) else [alias]
        for choice in choices:
            if isinstance(choice, str):
                names.add(choice.lower().removeprefix(PREFIX.lower()))
    return names


def unknown_variables(
    environ: Mapping[str, str | None], fields: Mapping[str, FieldInfo]
) -> list[tuple[str, str | None]]:
    """``(variable, closest setting or None)`` for each ``MEDIASERVER_*`` variable that no setting
    reads (case-insensitive, as the settings are), sorted by name."""
    known = setting_names(fields)
    found: list[tuple[str, str | None]] = []
    for variable in sorted(environ):
        if not variable.upper().startswith(PREFIX) or variable.upper() in NOT_SETTINGS:
            continue
        name = variable[len(PREFIX) :].lower()
        if name in known or name in REMOVED_SETTINGS:
            continue
        close = difflib.get_close_matches(name, sorted(set(fields)), n=1, cutoff=0.6)
        found.append((variable, close[0] if close else None))
    return found


def removed_variables(environ: Mapping[str, str | None]) -> list[tuple[str, str]]:
    """``(variable, why)`` for each variable of a removed setting (case-insensitive), sorted by name."""
    found: list[tuple[str, str]] = []
    for variable in sorted(environ):
        if variable.upper().startswith(PREFIX):
            why = REMOVED_SETTINGS.get(variable[len(PREFIX) :].lower())
            if why is not None:
                found.append((variable, why))
    return found


def warn_unknown_variables(
    environ: Mapping[str, str | None], fields: Mapping[str, FieldInfo], where: str = "the environment variable"
) -> list[str]:
    """Log one WARNING per unknown ``MEDIASERVER_*`` variable and per variable of a removed setting;
    return the warnings. ``where``: what holds them (the environment, or the ``.env`` file)."""
    messages = [
        f"the setting {variable} was removed and its value is ignored: {why}; remove it from the environment"
        for variable, why in removed_variables(environ)
    ]
    for variable, close in unknown_variables(environ, fields):
        hint = f"; did you mean {PREFIX}{close.upper()} ({close})?" if close else ""
        messages.append(f"{where} {variable} is not a setting and is ignored{hint}")
    for message in messages:
        log.warning("%s", message)
    return messages


def warn_unknown_in_dotenv(path: Path, fields: Mapping[str, FieldInfo]) -> list[str]:
    """``warn_unknown_variables`` for the variables of a ``.env`` file the settings read (an operator
    trial: a typo there was ignored without a word, while the same typo in the environment warned)."""
    if not path.is_file():
        return []
    from dotenv import dotenv_values

    return warn_unknown_variables(dotenv_values(path), fields, where=f"the variable in {path}")
