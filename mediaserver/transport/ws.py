"""Placeholder: being written (issue 5)."""

from __future__ import annotations

from aiohttp import web


def add_routes(app: web.Application) -> None:
    """Register this transport's routes (none yet)."""
