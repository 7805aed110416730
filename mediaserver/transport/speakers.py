"""Enrolment of speakers: ``/api/speakers`` (mediaserver/speakers).

* ``POST /api/speakers``: multipart ``name`` and one or more ``file`` fields (any format PyAV
  reads), optional ``replace=true`` to enrol a name again; 201 with the speaker (never its
  embedding), 409 for a name already enrolled without ``replace`` or a full store, 400 for a bad
  name, audio that does not decode, or too little speech.
* ``GET /api/speakers``: who is enrolled (names, clips, seconds of speech, when).
* ``DELETE /api/speakers/{name}``: forget a speaker (its file is deleted); 404 if unknown.

Every route sits behind the server's auth like any other; 503 when the speaker model is missing.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from mediaserver.audio.decode import decode_any
from mediaserver.errors import ModelUnavailable
from mediaserver.speakers.service import SpeakerService
from mediaserver.speakers.store import check_name
from mediaserver.state import SETTINGS, SPEAKERS
from mediaserver.transport.common import parse_bool, read_multipart


def _service(request: web.Request) -> SpeakerService:
    service = request.app.get(SPEAKERS)
    if service is None or service.problem is not None:
        reason = service.problem if service is not None else "not started"
        raise ModelUnavailable(f"speaker recognition is off: {reason}")
    return service


async def enrol_handler(request: web.Request) -> web.Response:
    service = _service(request)
    settings = request.app[SETTINGS]
    fields = await read_multipart(request, settings.max_upload_bytes, file_fields=("file",))
    name = check_name((fields.values.get("name") or [""])[-1])
    replace = parse_bool({k: v[-1] for k, v in fields.values.items()}, "replace", False)
    files = fields.file_lists.get("file") or [fields.require_file("file")]
    clips = [await asyncio.to_thread(decode_any, data, max_duration_s=settings.max_audio_duration_s) for data in files]
    speaker, replaced = await service.enrol(name, clips, replace=replace)
    return web.json_response({**speaker.public(), "replaced": replaced}, status=200 if replaced else 201)


async def list_handler(request: web.Request) -> web.Response:
    service = _service(request)
    speakers = sorted(service.store.snapshot(), key=lambda s: s.name.lower())
    return web.json_response({"speakers": [s.public() for s in speakers], "max": service.store.max_speakers})


async def delete_handler(request: web.Request) -> web.Response:
    service = _service(request)
    name = check_name(request.match_info["name"])
    await asyncio.to_thread(service.store.delete, name)
    return web.Response(status=204)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/speakers", enrol_handler)
    app.router.add_get("/api/speakers", list_handler)
    app.router.add_delete("/api/speakers/{name}", delete_handler)
