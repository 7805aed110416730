"""The words Whisper is told to expect: a request's or session's own prompt and the server-wide
``asr_vocabulary``, one bound and one rule for every face.

Whisper has one way to be told about rare words: text given as what came before the audio (the
decoder's "previous text", after ``<|startofprev|>``). faster-whisper's ``initial_prompt`` and its
``hotwords`` both put text there; ``hotwords`` is dropped whenever a decode has a forced prefix, which
the streams' finals and partials use, so the server uses ``initial_prompt`` only.

How the two combine (``merged``): the server's vocabulary first, then a space, then the session's
own prompt, so the session's words sit nearest the audio, where Whisper weighs them most. Either
alone is used as it is. The faces that take a prompt (the device WebSocket's and WebRTC's ``prompt``,
Realtime's ``input_audio_transcription.prompt``, the OpenAI upload's ``prompt``, WIS's ``prompt``
query parameter, Wyoming's ``transcript_names`` / ``transcript_terms``) check it with
``check_prompt``: the vocabulary and the prompt together hold at most ``asr_max_prompt_chars``
characters (the space between them not counted), else a 400 or an ``error`` in the face's shape. What
the faces echo (``ready``, ``session.updated``) is the session's own prompt; the vocabulary is the
server's setting, added to every decode of every model (the local engine and remote backends alike).

Characters, not tokens: the faces check before a model is chosen, and a remote backend has no local
tokenizer. Whisper reads at most 223 prompt tokens (half its 448-token context, less one) and keeps
the last 223 of a longer prompt, so past that the start of the vocabulary is what is lost; 600
characters measured 137 tiny.en tokens of English prose, 210 of a list of names.

A decode with a prompt uses the full 30 s encoder window (engine.py): on a short one tiny.en said a
prompted sentence twice over.
"""

from __future__ import annotations

from dataclasses import replace

from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.events import TranscriptionOptions


def prompt_room(settings: Settings) -> int:
    """Characters left for a session's own prompt beside the server's vocabulary."""
    return settings.asr_max_prompt_chars - len(settings.asr_vocabulary)


def prompt_problem(prompt: str | None, settings: Settings) -> str | None:
    """Why ``prompt`` cannot be used (too long beside ``asr_vocabulary``), or None when it can."""
    if prompt is None or len(prompt) <= prompt_room(settings):
        return None
    limit = settings.asr_max_prompt_chars
    if settings.asr_vocabulary:
        return (
            f"the prompt is {len(prompt)} characters; beside the server's vocabulary (asr_vocabulary, "
            f"{len(settings.asr_vocabulary)} characters) it may be at most {prompt_room(settings)} "
            f"(asr_max_prompt_chars = {limit})"
        )
    return f"the prompt is {len(prompt)} characters; it may be at most {limit} (asr_max_prompt_chars)"


def check_prompt(prompt: object, settings: Settings, param: str) -> str | None:
    """A face's prompt as given (None or empty: none), or ``InvalidParameter`` naming ``param``."""
    if prompt is None:
        return None
    if not isinstance(prompt, str):
        raise InvalidParameter(f"{param} must be a string", param=param)
    problem = prompt_problem(prompt, settings)
    if problem is not None:
        raise InvalidParameter(f"{param} too long: {problem}", param=param)
    return prompt or None


def merged(vocabulary: str, prompt: str | None) -> str | None:
    """The prompt a decode runs with: the vocabulary, then the session's own prompt."""
    parts = [part for part in (vocabulary.strip(), (prompt or "").strip()) if part]
    return " ".join(parts) or None


def with_vocabulary(options: TranscriptionOptions, vocabulary: str) -> TranscriptionOptions:
    """``options`` with the server's vocabulary before their own prompt (unchanged without one)."""
    if not vocabulary.strip():
        return options
    return replace(options, initial_prompt=merged(vocabulary, options.initial_prompt))
