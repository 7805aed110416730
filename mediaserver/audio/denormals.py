"""Denormal floats flushed to zero around a call: WebRTC's AEC3 fed digital silence (the reference
between answers, a device's silent microphone) decays into denormals, which x86 computes in
microcode, and ran 15-20 times slower (90 ms of CPU per second of audio against 6-7; docs/echo.md).
WebRTC's own audio threads set the processor's flush-to-zero and denormals-are-zero modes; the
pywebrtc-audio binding does not, and no maintained PyPI package sets them. Noise added instead (a
dither at -140 dBFS) changed AEC3's answer onsets: the echo cut a live test's answer in 4 of 5 runs
against 1 of 4 without it. So the modes are set here, for the AEC3 call alone, and put back after it: the event
loop's own arithmetic keeps its denormals.

x86-64 with glibc: ``fegetmode``/``fesetmode`` (glibc 2.25+) carry MXCSR's control bits, FTZ (bit
15) and DAZ (bit 6) among them, and leave its exception flags alone. Elsewhere (aarch64, musl,
macOS) ``call_flushed`` changes nothing: AEC3 then runs as the binding leaves it.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

FTZ_DAZ = 0x8040  # MXCSR: flush to zero (bit 15), denormals are zero (bit 6)


class _Mode(ctypes.Structure):
    """glibc's ``femode_t`` on x86-64: the x87 control word, then MXCSR."""

    _fields_ = [("control_word", ctypes.c_ushort), ("reserved", ctypes.c_ushort), ("mxcsr", ctypes.c_uint)]


def _libm() -> Any:
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        libm = ctypes.CDLL("libm.so.6")
        get, set_ = libm.fegetmode, libm.fesetmode  # glibc 2.25+; musl has neither
    except (OSError, AttributeError):
        return None
    get.argtypes = set_.argtypes = [ctypes.POINTER(_Mode)]
    get.restype = set_.restype = ctypes.c_int
    return libm


_LIBM = _libm()
_GET: Any = _LIBM.fegetmode if _LIBM is not None else None
_SET: Any = _LIBM.fesetmode if _LIBM is not None else None
_BYREF = ctypes.byref


def available() -> bool:
    """Whether ``call_flushed`` sets the modes on this machine."""
    return _LIBM is not None


def call_flushed(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with denormals flushed to zero (this thread only), the modes restored after."""
    if _LIBM is None:
        return fn(*args)
    saved = _Mode()
    if _GET(_BYREF(saved)) != 0:
        return fn(*args)
    _SET(_BYREF(_Mode(saved.control_word, saved.reserved, saved.mxcsr | FTZ_DAZ)))
    try:
        return fn(*args)
    finally:
        _SET(_BYREF(saved))
