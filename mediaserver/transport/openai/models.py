"""OpenAI ``GET /v1/models``: every model of every kind this server answers to (ASR, LLM, embeddings)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from mediaserver.llm.registry import DEFAULT_ALIAS, EMBEDDING_ALIAS
from mediaserver.state import ASR, CAPABILITIES, LLM, SETTINGS


async def models_handler(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    asr = request.app[ASR]
    names = asr.models.names() + [n for n in settings.asr_model_aliases if n not in asr.models.names()]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {"id": n, "object": "model", "created": 0, "owned_by": "mediaserver", "kind": "asr"} for n in names
            ]
            + model_entries(request.app),
        }
    )


def model_entries(app: web.Application) -> list[dict[str, Any]]:
    """The LLM's entries for ``GET /v1/models`` (none while the LLM is disabled)."""
    if not app[CAPABILITIES].enabled("llm") or LLM not in app:
        return []
    llm = app[LLM]
    settings = app[SETTINGS]
    entries: list[dict[str, Any]] = []
    for info in llm.models():
        owner = "upstream" if info.backend == "upstream" else "mediaserver"
        entries.append(
            {
                "id": info.name,
                "object": "model",
                "created": 0,
                "owned_by": owner,
                "kind": info.kind,
                "backend": info.backend,
            }
        )
    names = {e["id"] for e in entries}
    if llm.sources.default_name:
        for alias, target in settings.llm_model_aliases.items():
            if target == DEFAULT_ALIAS and alias not in names:
                entries.append({"id": alias, "object": "model", "created": 0, "owned_by": "mediaserver", "kind": "llm"})
    if llm.sources.embedding_name:
        for alias, target in settings.llm_embedding_aliases.items():
            if target == EMBEDDING_ALIAS and alias not in names:
                entries.append(
                    {"id": alias, "object": "model", "created": 0, "owned_by": "mediaserver", "kind": "embedding"}
                )
    return entries


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", models_handler)
