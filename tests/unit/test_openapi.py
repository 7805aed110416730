"""The OpenAPI document describes every HTTP endpoint the router serves, and nothing it does not."""

from __future__ import annotations

from aiohttp import web
from openapi_spec_validator import validate

from mediaserver.app import create_app
from mediaserver.config import Settings
from mediaserver.openapi import document as openapi

# Not in the document, on purpose, each for its reason. (The WebSockets are: their upgrade, a GET
# answered 101, as /api/ws/chatbot; their messages are in docs/ws-protocol.md and docs/realtime.md.)
PAGES = {
    ("get", "/"),
    ("get", "/rtc"),
    ("get", "/rtc/"),
    ("get", "/api/docs"),
    ("get", "/api/openapi.json"),  # the document itself
}
STATIC_PREFIXES = {"/audio", "/static", "/rtc"}


def router_operations(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route, without the HEADs aiohttp adds to GETs and the static files."""
    operations = set()
    for route in app.router.routes():
        if isinstance(route.resource, web.StaticResource):
            assert route.resource.canonical in STATIC_PREFIXES, route.resource.canonical
            continue
        if route.method == "HEAD":
            continue
        assert route.resource is not None
        operations.add((route.method.lower(), route.resource.canonical))
    return operations


def spec_operations(document: dict[str, object]) -> set[tuple[str, str]]:
    paths = document["paths"]
    assert isinstance(paths, dict)
    return {(method, path) for path, item in paths.items() for method in item}


def test_the_document_lists_exactly_the_routes() -> None:
    app = create_app(Settings())
    served = router_operations(app)
    allowed = PAGES
    assert allowed <= served, allowed - served  # an allow-listed route that no longer exists
    documented = spec_operations(openapi.spec())
    assert served - allowed == documented, {"undocumented": served - allowed - documented, "stale": documented - served}


def test_the_websockets_are_listed_as_upgrades() -> None:
    paths = openapi.spec()["paths"]
    assert isinstance(paths, dict)
    for path in ("/api/ws/asr", "/v1/realtime", "/api/ws/chatbot"):
        assert "101" in paths[path]["get"]["responses"], path


def test_the_document_is_valid_openapi() -> None:
    validate(openapi.spec())
