"""Every response format decodes (PyAV) to the duration that went in, also from a stream's first
bytes; the response cache is bounded and keyed by every parameter."""

from __future__ import annotations

import io
import wave
from collections.abc import Callable

import av
import numpy as np
import pytest

from mediaserver.metrics import Metrics
from mediaserver.tts.cache import TtsCache, cache_key
from mediaserver.tts.encode import FORMATS, StreamEncoder, output_rate, wav_header, with_wav_sizes
from mediaserver.tts.metrics import TtsMetrics
from tests.conftest import Clip, resample_to


def decoded_seconds(data: bytes) -> tuple[float, int, str]:
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples / stream.sample_rate, stream.sample_rate, stream.codec_context.name


def pcm_at(clip: Clip, rate_hz: int) -> bytes:
    if rate_hz == clip.rate_hz:
        return bytes(clip.pcm22k.astype("<i2").tobytes())
    return bytes((np.clip(resample_to(clip, rate_hz), -1, 1) * 32767).astype("<i2").tobytes())


def encode_in_pieces(fmt_name: str, pcm: bytes, rate_hz: int, pieces: int = 6) -> list[bytes]:
    encoder = StreamEncoder(FORMATS[fmt_name], rate_hz)
    step = len(pcm) // pieces // 2 * 2
    out = [encoder.push(pcm[i : i + step]) for i in range(0, len(pcm), step)]
    return [*out, encoder.finish()]


@pytest.mark.parametrize("name", ["wav", "mp3", "opus", "aac", "flac", "ogg"])
def test_every_format_decodes_to_the_duration_that_went_in(name: str, speech: Callable[[str], Clip]) -> None:
    clip = speech("story")
    rate = output_rate(FORMATS[name], clip.rate_hz)
    pcm = pcm_at(clip, rate)
    expected_s = len(pcm) / 2 / rate
    parts = encode_in_pieces(name, pcm, rate)
    seconds, decoded_rate, codec = decoded_seconds(b"".join(parts))
    # Codecs pad to whole frames and add priming samples: tens of milliseconds at most.
    assert seconds == pytest.approx(expected_s, abs=0.12), (codec, decoded_rate)
    assert seconds >= expected_s - 0.01
    expected_codec = {"wav": "pcm_s16le", "mp3": "mp3", "opus": "opus", "ogg": "opus", "aac": "aac", "flac": "flac"}
    assert codec.startswith(expected_codec[name])
    # Bytes leave while audio is still coming in, not all at the end.
    assert sum(len(p) for p in parts[:-1]) > len(b"".join(parts)) // 2


def test_pcm_is_the_samples_themselves(speech: Callable[[str], Clip]) -> None:
    pcm = pcm_at(speech("kitchen"), 24000)
    assert b"".join(encode_in_pieces("pcm", pcm, 24000)) == pcm


@pytest.mark.parametrize("name", ["wav", "mp3", "flac", "opus"])
def test_a_stream_is_playable_from_its_first_bytes(name: str, speech: Callable[[str], Clip]) -> None:
    clip = speech("story")
    rate = output_rate(FORMATS[name], clip.rate_hz)
    parts = encode_in_pieces(name, pcm_at(clip, rate), rate, pieces=4)
    head = b"".join(parts[:2])  # what a player has before the last byte exists
    seconds, decoded_rate, _ = decoded_seconds(head)
    assert decoded_rate in (rate, 48000)  # Opus always decodes at 48 kHz
    assert seconds > 0.3


def test_streaming_wav_header_says_unknown_length() -> None:
    header = wav_header(22050)
    assert header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    assert int.from_bytes(header[4:8], "little") == 0xFFFFFFFF  # "read to the end"
    assert int.from_bytes(header[40:44], "little") == 0xFFFFFFFF
    assert int.from_bytes(header[24:28], "little") == 22050
    known = wav_header(16000, data_bytes=100)
    assert len(known) == 44
    assert int.from_bytes(known[4:8], "little") == 136 and int.from_bytes(known[40:44], "little") == 100


def read_with_wave(data: bytes) -> tuple[int, bytes]:
    """What Python's ``wave`` makes of a WAV: its declared frame count and every frame it reads."""
    with wave.open(io.BytesIO(data)) as reader:
        assert (reader.getnchannels(), reader.getsampwidth()) == (1, 2)
        return reader.getnframes(), reader.readframes(1 << 31)


def test_streamed_wav_reads_with_wave_and_pyav(speech: Callable[[str], Clip]) -> None:
    """A streamed WAV (sizes unknown) reads to its end with Python's ``wave`` (which refuses a RIFF
    size of 0: "not a WAVE file") and with PyAV; ``wave``'s frame count is then a placeholder."""
    clip = speech("story")
    pcm = pcm_at(clip, clip.rate_hz)
    body = b"".join(encode_in_pieces("wav", pcm, clip.rate_hz))
    declared, frames = read_with_wave(body)
    assert frames == pcm and declared == 0x7FFFFFFF
    assert decoded_seconds(body)[0] == pytest.approx(len(pcm) / 2 / clip.rate_hz, abs=1e-6)


def test_wav_known_whole_carries_its_real_sizes(speech: Callable[[str], Clip]) -> None:
    clip = speech("kitchen")
    pcm = pcm_at(clip, clip.rate_hz)
    encoder = StreamEncoder(FORMATS["wav"], clip.rate_hz, total_bytes=len(pcm))
    step = len(pcm) // 3 // 2 * 2
    whole = b"".join([*(encoder.push(pcm[i : i + step]) for i in range(0, len(pcm), step)), encoder.finish()])
    assert read_with_wave(whole) == (len(pcm) // 2, pcm)
    assert int.from_bytes(whole[4:8], "little") == len(whole) - 8
    assert decoded_seconds(whole)[0] == pytest.approx(len(pcm) / 2 / clip.rate_hz, abs=1e-6)
    # A streamed WAV made whole afterwards (a cached answer) gets the same header.
    streamed = b"".join(encode_in_pieces("wav", pcm, clip.rate_hz))
    assert streamed != whole and with_wav_sizes(streamed) == whole
    with pytest.raises(ValueError, match="not a WAV"):
        with_wav_sizes(b"ID3" + pcm[:100])


def test_output_rates() -> None:
    assert output_rate(FORMATS["wav"], 22050) == 22050
    assert output_rate(FORMATS["mp3"], 22050) == 22050
    assert output_rate(FORMATS["opus"], 22050) == 24000
    assert output_rate(FORMATS["opus"], 44100) == 48000
    with pytest.raises(ValueError, match="cannot be encoded"):
        StreamEncoder(FORMATS["opus"], 22050)


def test_cache_is_bounded_and_counts() -> None:
    metrics = Metrics()
    cache = TtsCache(max_bytes=1000, max_entry_bytes=400, metrics=TtsMetrics.of(metrics))
    keys = [cache_key(text=f"phrase {i}", voice="v", speed=1.0, format="wav") for i in range(5)]
    assert len(set(keys)) == 5
    assert cache_key(a=1, b=2) == cache_key(b=2, a=1)
    assert cache_key(text="x", speed=1.0) != cache_key(text="x", speed=1.5)
    assert cache.get(keys[0]) is None
    for key in keys:
        assert cache.put(key, b"x" * 300, "audio/wav")
    assert cache.size_bytes <= 1000 and len(cache) == 3  # the oldest two were evicted
    assert cache.get(keys[0]) is None
    assert cache.get(keys[4]) == (b"x" * 300, "audio/wav")
    assert not cache.put("big", b"x" * 401, "audio/wav")  # larger than one entry may be
    text = metrics.render().decode()
    assert 'mediaserver_tts_cache_total{result="hit"} 1.0' in text
    assert 'mediaserver_tts_cache_total{result="miss"} 2.0' in text
    assert "mediaserver_tts_cache_bytes 900.0" in text
