"""How many threads FFmpeg (under PyAV and aiortc) may start: one per core by default, and none here.

Every audio conversion PyAV makes runs a libavfilter graph (``av.AudioResampler``, and the one an
audio encoder makes inside ``CodecContext.encode``: aiortc's Opus track, the speech endpoints'
encoders), and a graph starts a thread pool of ``av_cpu_count()`` threads: two per live stream on
this 2-core machine, more on a server. They last as long as their Python object, and a session
caught in a reference cycle keeps its objects until the cyclic garbage collector runs: in the mixed
soak (tools/soak_mixed.py) the server's threads climbed to 60 between collections. Converting a
20 ms frame gains nothing from threads, so ``limit_ffmpeg_threads`` makes libavutil report
``ffmpeg_threads`` cores (``av_cpu_force_count``): at 1, graphs and codecs start no threads.

PyAV exposes no such call (nor the graph its resampler builds), hence ctypes on the libavutil PyAV
loaded; where it cannot be found the call logs and changes nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
from pathlib import Path

import av  # noqa: F401  (loads libavutil, which is then looked up among the loaded libraries)

log = logging.getLogger(__name__)


@functools.cache  # one library per process: create_app calls this for every app
def _loaded_libavutil() -> str | None:
    """The path of the libavutil this process loaded (Linux: /proc/self/maps), else the system's."""
    maps = Path("/proc/self/maps")
    if sys.platform.startswith("linux") and maps.exists():
        for line in maps.read_text().splitlines():
            path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
            if "/libavutil" in path and ".so" in path:
                return path.strip()
    return ctypes.util.find_library("avutil")


def limit_ffmpeg_threads(threads: int) -> bool:
    """Make FFmpeg's filter graphs and codecs size their thread pools for ``threads`` cores (0:
    FFmpeg's own count, its default). Process-wide, for what is created afterwards; True if applied."""
    path = _loaded_libavutil()
    if path is None:
        log.warning("libavutil not found: ffmpeg_threads=%d not applied", threads)
        return False
    try:
        libavutil = ctypes.CDLL(path)
        libavutil.av_cpu_force_count(ctypes.c_int(threads))
    except (OSError, AttributeError) as exc:
        log.warning("ffmpeg_threads=%d not applied (%s): %s", threads, path, exc)
        return False
    return True
