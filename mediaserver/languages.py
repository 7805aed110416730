"""Whisper's language table, and turning what clients send into a Whisper language code.

The table exists because the three APIs disagree on how a language is spelled: OpenAI's
``verbose_json`` reports the full lower-case English name (``"english"``), WIS validates
``force_language`` against Whisper's own codes (``"en"``), and browsers and phones send locale tags
(``"en-US"``, ``"pt_BR"``). Names are spelled exactly as OpenAI whisper's ``tokenizer.LANGUAGES``;
the set of codes is exactly faster-whisper's ``tokenizer._LANGUAGE_CODES`` (a unit test checks it).
"""

from __future__ import annotations

import re
from typing import Final

WHISPER_LANGUAGES: Final[dict[str, str]] = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "ru": "russian",
    "ko": "korean",
    "fr": "french",
    "ja": "japanese",
    "pt": "portuguese",
    "tr": "turkish",
    "pl": "polish",
    "ca": "catalan",
    "nl": "dutch",
    "ar": "arabic",
    "sv": "swedish",
    "it": "italian",
    "id": "indonesian",
    "hi": "hindi",
    "fi": "finnish",
    "vi": "vietnamese",
    "he": "hebrew",
    "uk": "ukrainian",
    "el": "greek",
    "ms": "malay",
    "cs": "czech",
    "ro": "romanian",
    "da": "danish",
    "hu": "hungarian",
    "ta": "tamil",
    "no": "norwegian",
    "th": "thai",
    "ur": "urdu",
    "hr": "croatian",
    "bg": "bulgarian",
    "lt": "lithuanian",
    "la": "latin",
    "mi": "maori",
    "ml": "malayalam",
    "cy": "welsh",
    "sk": "slovak",
    "te": "telugu",
    "fa": "persian",
    "lv": "latvian",
    "bn": "bengali",
    "sr": "serbian",
    "az": "azerbaijani",
    "sl": "slovenian",
    "kn": "kannada",
    "et": "estonian",
    "mk": "macedonian",
    "br": "breton",
    "eu": "basque",
    "is": "icelandic",
    "hy": "armenian",
    "ne": "nepali",
    "mn": "mongolian",
    "bs": "bosnian",
    "kk": "kazakh",
    "sq": "albanian",
    "sw": "swahili",
    "gl": "galician",
    "mr": "marathi",
    "pa": "punjabi",
    "si": "sinhala",
    "km": "khmer",
    "sn": "shona",
    "yo": "yoruba",
    "so": "somali",
    "af": "afrikaans",
    "oc": "occitan",
    "ka": "georgian",
    "be": "belarusian",
    "tg": "tajik",
    "sd": "sindhi",
    "gu": "gujarati",
    "am": "amharic",
    "yi": "yiddish",
    "lo": "lao",
    "uz": "uzbek",
    "fo": "faroese",
    "ht": "haitian creole",
    "ps": "pashto",
    "tk": "turkmen",
    "nn": "nynorsk",
    "mt": "maltese",
    "sa": "sanskrit",
    "lb": "luxembourgish",
    "my": "myanmar",
    "bo": "tibetan",
    "tl": "tagalog",
    "mg": "malagasy",
    "as": "assamese",
    "tt": "tatar",
    "haw": "hawaiian",
    "ln": "lingala",
    "ha": "hausa",
    "ba": "bashkir",
    "jw": "javanese",
    "su": "sundanese",
    "yue": "cantonese",
}

# Name -> code, with the same extra aliases as OpenAI whisper's ``TO_LANGUAGE_CODE``.
LANGUAGE_ALIASES: Final[dict[str, str]] = {
    **{name: code for code, name in WHISPER_LANGUAGES.items()},
    "burmese": "my",
    "valencian": "ca",
    "flemish": "nl",
    "haitian": "ht",
    "letzeburgesch": "lb",
    "pushto": "ps",
    "panjabi": "pa",
    "moldavian": "ro",
    "moldovan": "ro",
    "sinhalese": "si",
    "castilian": "es",
    "mandarin": "zh",
}

# Standard or legacy ISO 639 codes that locale tags use where Whisper spells the language differently
# (Java's Locale still produces "iw"/"in"/"ji"; browsers send "nb-NO" for Norwegian).
_CODE_ALIASES: Final[dict[str, str]] = {
    "jv": "jw",
    "nb": "no",
    "iw": "he",
    "in": "id",
    "ji": "yi",
}

# A BCP-47 / POSIX locale tag: language subtag, then one or more subtags separated by "-" or "_".
_LOCALE_TAG: Final[re.Pattern[str]] = re.compile(r"([a-z]{2,3})(?:[-_][a-z0-9]{1,8})+")

_AUTO: Final[frozenset[str]] = frozenset({"", "auto"})


def _lookup_code(code: str) -> str | None:
    if code in WHISPER_LANGUAGES:
        return code
    return _CODE_ALIASES.get(code)


def normalize_language(value: str | None) -> str | None:
    """Return the Whisper code for a code, locale tag or English name; None means "detect".

    Accepts ``"en"``/``"EN"``, ``"en-US"``/``"pt_BR"``/``"zh-Hant-TW"`` and ``"German"``/``"mandarin"``;
    ``None``, ``""`` and ``"auto"`` give None. Raises ValueError for anything else.
    """
    if value is None:
        return None
    text = value.strip()
    key = text.lower()
    if key in _AUTO:
        return None
    code = _lookup_code(key)
    if code is not None:
        return code
    code = LANGUAGE_ALIASES.get(key)
    if code is not None:
        return code
    match = _LOCALE_TAG.fullmatch(key)
    if match is not None:
        code = _lookup_code(match.group(1))
        if code is not None:
            return code
    raise ValueError(f"unsupported language {text!r}")


def language_name(code: str) -> str:
    """Return the lower-case English name of a Whisper code (``"en"`` -> ``"english"``)."""
    name = WHISPER_LANGUAGES.get(code.strip().lower())
    if name is None:
        raise ValueError(f"unsupported language {code!r}")
    return name
