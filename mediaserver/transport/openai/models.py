"""OpenAI ``GET /v1/models``: every model of every kind this server answers to (ASR, LLM, embeddings),
aliases included; ``GET /v1/models/{model}``: one of them (the SDK's ``client.models.retrieve``)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from mediaserver.errors import ApiError
from mediaserver.llm.registry import DEFAULT_ALIAS, EMBEDDING_ALIAS
from mediaserver.state import ASR, CAPABILITIES, LLM, SETTINGS


class ModelNotFound(ApiError):
    """OpenAI's answer to retrieving a model that does not exist."""

    status = 404
    code = "model_not_found"


def all_entries(app: web.Application) -> list[dict[str, Any]]:
    """Every entry of ``GET /v1/models``: the ASR models and their aliases, then the LLM's."""
    settings = app[SETTINGS]
    asr = app[ASR]
    names = asr.models.names() + [n for n in settings.asr_model_aliases if n not in asr.models.names()]
    asr_entries: list[dict[str, Any]] = [
        {"id": n, "object": "model", "created": 0, "owned_by": "mediaserver", "kind": "asr"} for n in names
    ]
    return asr_entries + model_entries(app)


async def models_handler(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": all_entries(request.app)})


async def model_handler(request: web.Request) -> web.Response:
    """GET /v1/models/{model}: the entry ``/v1/models`` lists under that id (the first, should an
    ASR and an LLM name collide), or a 404 ``model_not_found``."""
    model = request.match_info["model"]
    for entry in all_entries(request.app):
        if entry["id"] == model:
            return web.json_response(entry)
    raise ModelNotFound(f"The model '{model}' does not exist; GET /v1/models lists the models", param="model")


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
    app.router.add_get("/v1/models/{model:.+}", model_handler)  # ids may hold a "/" (Hugging Face names)
