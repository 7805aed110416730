"""Ports on loopback, for tests and tools alike: a free one to hand a child process, and the one a
test server bound when it was given port 0."""

from __future__ import annotations

import socket

from aiohttp import web


def free_port() -> int:
    """A port nothing listens on right now (bound and released: a child process can take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bound_port(runner: web.BaseRunner) -> int:
    """The port a started runner's (only) site listens on: the OS's choice when the site asked for 0."""
    return int(runner.addresses[0][1])
