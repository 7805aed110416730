"""A size-bounded LRU of finished responses, for the phrases devices ask for again and again.

Willow devices fetch "Success", "Error" and the same answers over and over; WIS put nginx's
cache in front of its TTS for that (``X-WIS-Cache: HIT|MISS|BYPASS``, ``?nocache=``). The key is
every parameter that changes the bytes (text, voice, speaker, speed, format, sample rate ...), so
a hit returns exactly the bytes the first request got.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Literal

from mediaserver.tts.metrics import TtsMetrics

CacheResult = Literal["hit", "miss", "bypass"]


def cache_key(**parts: object) -> str:
    """A stable key from named parts (order does not matter)."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class TtsCache:
    def __init__(self, *, max_bytes: int, max_entry_bytes: int, metrics: TtsMetrics) -> None:
        self.max_bytes = max_bytes
        self.max_entry_bytes = min(max_entry_bytes, max_bytes)
        self._entries: OrderedDict[str, tuple[bytes, str]] = OrderedDict()
        self._bytes = 0
        self._metrics = metrics

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def count(self, result: CacheResult) -> None:
        self._metrics.cache.labels(result).inc()

    def get(self, key: str) -> tuple[bytes, str] | None:
        """(body, content type) of a cached response, counted as a hit or a miss."""
        found = self._entries.get(key)
        if found is None:
            self.count("miss")
            return None
        self._entries.move_to_end(key)
        self.count("hit")
        return found

    def put(self, key: str, body: bytes, content_type: str) -> bool:
        """Store a response; False when it is larger than ``max_entry_bytes`` (not stored)."""
        if not self.enabled or len(body) > self.max_entry_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old[0])
        self._entries[key] = (body, content_type)
        self._bytes += len(body)
        while self._bytes > self.max_bytes and self._entries:
            _, (evicted, _) = self._entries.popitem(last=False)
            self._bytes -= len(evicted)
        self._metrics.cache_bytes.set(self._bytes)
        self._metrics.cache_entries.set(len(self._entries))
        return True

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
        self._metrics.cache_bytes.set(0)
        self._metrics.cache_entries.set(0)
