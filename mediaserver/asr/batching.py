"""Cross-job batching for CTranslate2 Whisper.

Whisper's encoder always sees a 30 s window, so a 3 s command costs nearly a full window. A batch
of jobs becomes windows (windows.py: long audio is cut at pauses into <= 30 s windows; short jobs
may be packed several to a window); ``BatchDecoder`` here encodes all windows of a decode group in
one CTranslate2 call and generates with one prompt per window (its own language, task and
timestamp mode). Results are split back per job (windows.py) and stitched in time order.

Anything this fast path cannot do as well as faster-whisper's own loop (word timestamps, sampling
at a non-zero first temperature, a window whose decode looks like a loop or gibberish) goes back to
the caller as "needs the sequential path", which runs Whisper's full temperature fallback.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mediaserver.asr.tails import drop_repeated_start
from mediaserver.asr.windows import (
    SHORT_WINDOW_EXTRA_TOKENS,
    SHORT_WINDOW_TOKENS_PER_S,
    WINDOW_S,
    Window,
    WindowOutput,
)
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray

log = logging.getLogger(__name__)


def _with_lead(window: Window) -> AudioArray:
    """The window's audio as the encoder hears it: after its ``lead_s`` of silence."""
    if window.lead_s <= 0:
        return window.audio
    return np.concatenate([np.zeros(round(window.lead_s * SAMPLE_RATE_HZ), np.float32), window.audio])


class BatchDecoder:
    """Runs windows through a faster-whisper ``WhisperModel``'s CTranslate2 model in batches.

    It owns the batched fast path faster-whisper itself does not have: one encoder pass over many
    windows and one generate call with a prompt per window. Windows of one call must share the
    prompt shape and beam size (``run`` groups them).
    """

    def __init__(
        self,
        whisper_model: Any,
        *,
        is_oom: Callable[[BaseException], bool] | None = None,
        max_encoder_windows: int = 0,
    ) -> None:
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self.wm = whisper_model
        self.multilingual = bool(whisper_model.model.is_multilingual)
        self._tokenizer_cls = Tokenizer
        self._suppressed = get_suppressed_tokens(self.tokenizer(None, "transcribe"), (-1,))
        self._is_oom = is_oom or _is_out_of_memory
        # On the CPU, at most this many windows per encoder call (0 = all): the encoder's attention
        # scores take (windows x heads x frames²) floats, 430 MB for 8 full windows of tiny.en,
        # and CTranslate2's allocator keeps its peak.
        self.max_encoder_windows = max_encoder_windows
        # Called with (windows, seconds) after every encoder pass: the packing policy's measurement.
        self.on_encode: Callable[[int, float], None] | None = None

    def tokenizer(self, language: str | None, task: str) -> Any:
        return self._tokenizer_cls(
            self.wm.hf_tokenizer,
            self.multilingual,
            task=task,
            language=(language or "en") if self.multilingual else None,
        )

    def features(self, windows: Sequence[Window]) -> np.ndarray:
        """Log-mel features padded to 30 s, cut to the windows' encoder length (one per call)."""
        from faster_whisper.audio import pad_or_trim

        frames = round(windows[0].encoder_s * self.wm.frames_per_second)
        return np.stack(
            [pad_or_trim(self.wm.feature_extractor(_with_lead(w))[..., :-1])[..., :frames] for w in windows]
        ).astype(np.float32)

    def prompt_shape(self, window: Window) -> tuple[int, bool, int]:
        """CTranslate2 needs <|startoftranscript|> at the same index and the same number of task
        tokens in every prompt of one generate call; windows are grouped by this shape."""
        tokenizer = self.tokenizer(window.language, window.options.task)
        previous = 0
        if tokens := self.previous_tokens(tokenizer, window):
            previous = 1 + len(tokens[-(self.wm.max_length // 2 - 1) :])
        prefix = len(self.prefix_tokens(tokenizer, window.options.prefix))
        return previous, window.with_timestamps, prefix

    @staticmethod
    def previous_tokens(tokenizer: Any, window: Window) -> list[int]:
        """The prompt's previous text: the request's prompt, then the text a tail follows."""
        tokens: list[int] = []
        for text in (window.options.initial_prompt, window.follows):
            if text and text.strip():
                tokens += tokenizer.encode(" " + text.strip())
        return tokens

    def prefix_tokens(self, tokenizer: Any, prefix: str | None) -> list[int]:
        if not prefix or not prefix.strip():
            return []
        tokens: list[int] = tokenizer.encode(" " + prefix.strip())
        return tokens[: self.wm.max_length // 2 - 1]

    def run(self, windows: Sequence[Window]) -> list[WindowOutput]:
        """Decode windows of one beam size: one encoder pass and generate call per prompt shape
        and encoder window length."""
        groups: dict[tuple[tuple[int, bool, int], float], list[int]] = defaultdict(list)
        for index, window in enumerate(windows):
            groups[self.prompt_shape(window), window.encoder_s].append(index)
        outputs: list[WindowOutput | None] = [None] * len(windows)
        for indices in groups.values():
            for index, output in zip(indices, self._run_split_on_oom([windows[i] for i in indices]), strict=True):
                outputs[index] = output
        return [o for o in outputs if o is not None]

    def _run_split_on_oom(self, windows: Sequence[Window]) -> list[WindowOutput]:
        try:
            return self._run(windows)
        except Exception as exc:
            if len(windows) > 1 and self._is_oom(exc):
                half = len(windows) // 2
                log.warning("out of memory on a batch of %d windows: splitting it", len(windows))
                return self._run_split_on_oom(windows[:half]) + self._run_split_on_oom(windows[half:])
            raise

    def _run(self, windows: Sequence[Window]) -> list[WindowOutput]:
        """One encoder pass and one generate call for windows of one prompt shape and beam size."""
        if not windows:
            return []
        features = self.features(windows)
        encode_started = time.perf_counter()
        encoder_output = self._encode(features)
        if self.on_encode is not None:
            self.on_encode(len(windows), time.perf_counter() - encode_started)
        prompts = self._prompts(windows, encoder_output)
        max_length = self.wm.max_length
        if windows[0].encoder_s < WINDOW_S:
            longest_s = max(w.duration_s for w in windows)
            budget = round(longest_s * SHORT_WINDOW_TOKENS_PER_S) + SHORT_WINDOW_EXTRA_TOKENS
            max_length = min(max_length, max(len(p.tokens) for p in prompts) + budget)
        results = self._generate(
            encoder_output, [p.tokens for p in prompts], windows[0].options.beam_size, max_length=max_length
        )
        outputs = [
            self._parse(window, result, prompt)
            for window, result, prompt in zip(windows, results, prompts, strict=True)
        ]
        if max_length < self.wm.max_length:
            for output, result, prompt in zip(outputs, results, prompts, strict=True):
                output.capped = len(prompt.tokens) + len(result.sequences_ids[0]) >= max_length - 1
        return outputs

    def _encode(self, features: np.ndarray) -> Any:
        """The encoder output of all windows, computed ``max_encoder_windows`` at a time on the CPU."""
        step = self.max_encoder_windows
        if step <= 0 or len(features) <= step or self.wm.model.device != "cpu":
            return self.wm.encode(features)
        import ctranslate2

        parts = [np.asarray(self.wm.encode(features[i : i + step])) for i in range(0, len(features), step)]
        return ctranslate2.StorageView.from_array(np.concatenate(parts))

    def _prompts(self, windows: Sequence[Window], encoder_output: Any) -> list[_Prompt]:
        """Each window's language (given, or detected on the encoder output) and decoder prompt."""
        needs_detection = self.multilingual and any(w.language is None for w in windows)
        detected = self.wm.model.detect_language(encoder_output) if needs_detection else None
        prompts: list[_Prompt] = []
        for index, window in enumerate(windows):
            if not self.multilingual:
                language, probability = "en", 1.0
            elif window.language is not None:
                language, probability = window.language, 1.0
            else:
                assert detected is not None
                token, probability = detected[index][0]
                language = token[2:-2]
            tokenizer = self.tokenizer(language, window.options.task)
            options = window.options
            tokens = self.wm.get_prompt(
                tokenizer,
                previous_tokens=self.previous_tokens(tokenizer, window),
                without_timestamps=not window.with_timestamps,
                prefix=options.prefix if options.prefix and options.prefix.strip() else None,
            )
            prompts.append(_Prompt(tokens, tokenizer, language, float(probability)))
        return prompts

    def _generate(self, encoder_output: Any, prompts: list[list[int]], beam_size: int, *, max_length: int) -> Any:
        return self.wm.model.generate(
            encoder_output,
            prompts,
            beam_size=beam_size,
            patience=1.0,
            length_penalty=1.0,
            max_length=max_length,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self._suppressed,
            max_initial_timestamp_index=round(1.0 / self.wm.time_precision),
            sampling_temperature=1.0,
        )

    def _parse(self, window: Window, result: Any, prompt: _Prompt) -> WindowOutput:
        """A generation result → segments in window time, with Whisper's quality scores."""
        from faster_whisper.transcribe import get_compression_ratio

        tokenizer = prompt.tokenizer
        # CTranslate2 returns the forced prefix as part of the sequence, so the text is whole.
        tokens = list(result.sequences_ids[0])
        cum_logprob = result.scores[0] * (len(tokens) ** 1.0)
        avg_logprob = cum_logprob / (len(tokens) + 1)
        text = tokenizer.decode(tokens)
        complete_until_s = float("inf")
        if window.with_timestamps:
            lead_s = window.lead_s
            duration_s = window.duration_s + lead_s
            segment_size = int(np.ceil(duration_s) * self.wm.frames_per_second)
            # faster-whisper has no public way to split a token sequence at its timestamps; this
            # private method is why faster-whisper is pinned below 1.3 (pyproject.toml).
            raw_segments, seek, single_timestamp_ending = self.wm._split_segments_by_timestamps(
                tokenizer=tokenizer,
                tokens=tokens,
                time_offset=0.0,
                segment_size=segment_size,
                segment_duration=duration_s,
                seek=0,
            )
            if not single_timestamp_ending and seek < segment_size:
                complete_until_s = max(0.0, seek / self.wm.frames_per_second - lead_s)
            if lead_s:  # (times in the window's own audio, the lead left out)
                for raw in raw_segments:
                    raw["start"], raw["end"] = max(0.0, raw["start"] - lead_s), max(0.0, raw["end"] - lead_s)
        else:
            raw_segments = [{"start": 0.0, "end": window.duration_s, "tokens": tokens}]
        segments = []
        for raw in raw_segments:
            seg_text = tokenizer.decode([t for t in raw["tokens"] if t < tokenizer.eot])
            if not seg_text.strip():
                continue
            segments.append(
                {
                    "start": float(raw["start"]),
                    "end": float(min(raw["end"], window.duration_s)),
                    "text": seg_text,
                    "tokens": tuple(int(t) for t in raw["tokens"]),
                }
            )
        if window.follows:
            segments = drop_repeated_start(segments, window.follows, tokenizer)
        return WindowOutput(
            segments=segments,
            language=prompt.language,
            language_probability=prompt.language_probability,
            avg_logprob=float(avg_logprob),
            no_speech_prob=float(result.no_speech_prob),
            compression_ratio=float(get_compression_ratio(text.strip())) if text.strip() else 0.0,
            temperature=0.0,
            complete_until_s=complete_until_s,
        )


@dataclass(frozen=True)
class _Prompt:
    tokens: list[int]
    tokenizer: Any
    language: str
    language_probability: float


def _is_out_of_memory(exc: BaseException) -> bool:
    message = str(exc).lower()
    return "out of memory" in message or "cuda_error_out_of_memory" in message or "std::bad_alloc" in message
