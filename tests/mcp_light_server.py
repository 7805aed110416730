"""A real MCP server for the tests, built with the ``mcp`` package: lights that can be switched.

    python -m tests.mcp_light_server --state FILE stdio
    python -m tests.mcp_light_server --state FILE http --port N [--token T]

Tools: ``set_light(name, on)``, ``get_state(name)`` (``name`` one of ``Light``: an enum in the
schema, so a grammar-constrained small model names a real light), ``echo(text)``,
``slow(seconds)`` (sleeps: a tool past the call timeout; it creates FILE with the suffix
``.slow`` when it starts, for a test to see the call running) and ``broken()`` (raises: a tool that
fails). ``--whoami`` adds ``whoami()``: the speaker mediaserver put in the call's ``_meta``
(``mediaserver/speaker``), or "nobody" (off by default: a small model offered one more tool may
choose it). The lights live in FILE (JSON), so a test sees a change made by a server it did not
start itself (stdio: mediaserver's child). With ``--token``, HTTP requests without
``Authorization: Bearer T`` get a 401.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any, Literal

from mcp.server.mcpserver import Context, MCPServer

Light = Literal["kitchen", "bedroom", "living room"]


def build(state: Path, *, with_whoami: bool = False) -> MCPServer:
    server = MCPServer("lights")

    def load() -> dict[str, bool]:
        return json.loads(state.read_text()) if state.exists() else {}

    @server.tool()
    def set_light(name: Light, on: bool) -> str:
        """Turn a light (kitchen, bedroom, ...) on or off."""
        lights = load()
        lights[name.strip().lower()] = on
        state.write_text(json.dumps(lights))
        return f"The {name} light is now {'on' if on else 'off'}."

    @server.tool()
    def get_state(name: Light) -> str:
        """Whether a light is on or off."""
        value = load().get(name.strip().lower())
        return f"The {name} light is {'unknown' if value is None else 'on' if value else 'off'}."

    @server.tool()
    def echo(text: str) -> str:
        """Say it back."""
        return text

    @server.tool()
    async def slow(seconds: float) -> str:
        """Wait, then answer."""
        state.with_suffix(".slow").touch()  # a test sees the call running here
        await asyncio.sleep(seconds)
        return "done"

    @server.tool()
    def broken() -> str:
        """Always fails."""
        raise RuntimeError("the light controller is on fire")

    if with_whoami:

        @server.tool()
        def whoami(ctx: Context) -> str:
            """Who is asking."""
            meta: Any = ctx.request_context.meta or {}
            return str(meta.get("mediaserver/speaker") or "nobody")

    return server


def _with_token(app: Any, token: str) -> Any:
    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token")
    parser.add_argument("--whoami", action="store_true")
    args = parser.parse_args()
    server = build(args.state, with_whoami=args.whoami)
    if args.transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app: Any = server.streamable_http_app()
    if args.token:
        app = _with_token(app, args.token)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
