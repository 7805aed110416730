"""Mint a short-lived client secret for the ``/rtc/`` page and print the page's URL with it.

    python -m mediaserver.mint_secret --server http://localhost:19001 --api-key "$KEY" --ttl 600
    http://localhost:19001/rtc/#client_secret=ek_...

It asks the running server (``POST /v1/realtime/client_secrets``, with the real key) for a
``realtime`` secret, which opens the page's endpoints and nothing else until it expires (see
docs/realtime.md). The secret rides in the URL's fragment: a browser never sends a fragment to the
server, so it stays out of access logs and ``Referer`` headers. A session the page opened keeps
running after the secret expires; a new connection (or a Speak request) then needs a new URL.

``--public-url`` prints another address than the one minted at (the page's HTTPS address, say:
browsers allow the microphone only on HTTPS or localhost); ``--page`` another page or options
(``/rtc/embed.html``, ``/rtc/?model=base``). The key may come from ``MEDIASERVER_API_KEY`` instead
of the command line (which other users can see in the process list). Errors are one line on stderr
and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

ENV_KEY = "MEDIASERVER_API_KEY"
DEFAULT_SERVER = "http://localhost:19001"


class MintError(Exception):
    """Why no secret was minted, in a sentence for the operator."""


def _error_message(body: bytes) -> str:
    """The server's error message (OpenAI's ``{"error": {"message"}}`` shape), else its text."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:300]
    error = decoded.get("error") if isinstance(decoded, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str):
        return message
    return str(error if error is not None else decoded)[:300]


def mint(
    server: str,
    api_key: str | None,
    ttl_s: int,
    *,
    timeout_s: float = 10.0,
    context: ssl.SSLContext | None = None,
) -> dict[str, Any]:
    """``POST {server}/v1/realtime/client_secrets`` for a ``realtime`` secret living ``ttl_s``:
    the answer ``{value, expires_at, session}``, or a ``MintError``."""
    url = server.rstrip("/") + "/v1/realtime/client_secrets"
    body = {"expires_after": {"anchor": "created_at", "seconds": ttl_s}, "session": {"type": "realtime"}}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        message = _error_message(exc.read())
        if exc.code == 401:
            hint = "give the server's API key (--api-key or $" + ENV_KEY + ")" if not api_key else "wrong API key?"
            raise MintError(f"{url} refused the credentials (401: {message}); {hint}") from None
        if exc.code == 404:
            raise MintError(f"{url} does not exist (404): is --server a mediaserver?") from None
        raise MintError(f"{url} answered {exc.code}: {message}") from None
    except urllib.error.URLError as exc:
        hint = " (a self-signed certificate? --cafile)" if isinstance(exc.reason, ssl.SSLError) else ""
        raise MintError(f"cannot reach {url}: {exc.reason}{hint}") from None
    except (TimeoutError, ConnectionError) as exc:
        raise MintError(f"cannot reach {url}: {exc}") from None
    except ValueError:
        raise MintError(f"{url} answered something that is not JSON: is --server a mediaserver?") from None
    if not isinstance(answer, dict) or not str(answer.get("value", "")).startswith("ek_"):
        raise MintError(f"{url} answered without a client secret: {str(answer)[:300]}")
    return answer


def page_url(public_url: str, page: str, secret: str) -> str:
    """The page's address with the secret in its fragment."""
    return f"{public_url.rstrip('/')}/{page.lstrip('/')}#client_secret={secret}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mediaserver.mint_secret",
        description="Mint a short-lived client secret on a running mediaserver and print the /rtc/ "
        "page's URL carrying it (#client_secret=ek_...), so the page never holds the real key.",
    )
    parser.add_argument("--server", default=DEFAULT_SERVER, help=f"the server to mint at (default {DEFAULT_SERVER})")
    parser.add_argument(
        "--api-key", default=os.environ.get(ENV_KEY), help=f"one of the server's api_keys (default ${ENV_KEY})"
    )
    parser.add_argument(
        "--ttl", type=int, default=600, help="seconds the secret lives (10 to realtime_client_secret_max_ttl_s; 600)"
    )
    parser.add_argument("--public-url", help="the address printed, as browsers reach the server (default --server)")
    parser.add_argument("--page", default="/rtc/", help="the page and its options (default /rtc/)")
    parser.add_argument("--cafile", help="CA certificate(s) to trust for an https --server (a self-signed cert)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the server (default 10)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        context = ssl.create_default_context(cafile=args.cafile) if args.cafile else None
    except (OSError, ssl.SSLError) as exc:
        print(f"mint_secret: cannot read --cafile {args.cafile}: {exc}", file=sys.stderr)
        return 1
    try:
        answer = mint(args.server, args.api_key, args.ttl, timeout_s=args.timeout, context=context)
    except MintError as exc:
        print(f"mint_secret: {exc}", file=sys.stderr)
        return 1
    print(page_url(args.public_url or args.server, args.page, answer["value"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
