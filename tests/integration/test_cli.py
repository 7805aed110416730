"""The server as a user starts it: `python -m mediaserver`, HTTP always, HTTPS once certs exist."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import ssl
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def load_gen_cert() -> object:
    spec = importlib.util.spec_from_file_location("gen_cert", ROOT / "tools" / "gen_cert.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def wait_healthy(
    url: str, ssl_context: ssl.SSLContext | bool = True, timeout_s: float = 60.0
) -> dict[str, object]:
    async with aiohttp.ClientSession() as session:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                async with session.get(f"{url}/health", ssl=ssl_context) as resp:
                    if resp.status == 200:
                        result: dict[str, object] = await resp.json()
                        return result
            except aiohttp.ClientConnectionError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{url} did not become healthy")
            await asyncio.sleep(0.3)


async def test_serves_http_and_https_with_generated_certs(tmp_path: Path) -> None:
    gen_cert = load_gen_cert()
    cert, _key = gen_cert.generate_self_signed(tmp_path / "certs")  # type: ignore[attr-defined]
    http_port, https_port = free_port(), free_port()
    env = dict(os.environ, MEDIASERVER_WYOMING_ENABLED="false", MEDIASERVER_SAVE_AUDIO_DIR=str(tmp_path / "audio"))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mediaserver",
        "--host",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--https-port",
        str(https_port),
        "--cert-dir",
        str(tmp_path / "certs"),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        health = await wait_healthy(f"http://127.0.0.1:{http_port}", True)
        assert health["status"] == "ok" and "tiny.en" in health["models_loaded"]  # type: ignore[operator]
        trusted = ssl.create_default_context(cafile=str(cert))
        health = await wait_healthy(f"https://localhost:{https_port}", trusted)
        assert health["status"] == "ok"
        untrusted = ssl.create_default_context()
        async with aiohttp.ClientSession() as session:
            try:
                async with session.get(f"https://localhost:{https_port}/health", ssl=untrusted):
                    raise AssertionError("a self-signed cert must not verify without being trusted")
            except aiohttp.ClientConnectorCertificateError:
                pass
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    text = output.decode()
    assert process.returncode == 0, text
    assert "ASR device: cpu, compute type int8" in text
    assert f"listening on https://127.0.0.1:{https_port}" in text


async def test_without_certs_https_is_off_and_says_how_to_turn_it_on(tmp_path: Path) -> None:
    http_port = free_port()
    env = dict(os.environ, MEDIASERVER_WYOMING_ENABLED="false", MEDIASERVER_SAVE_AUDIO_DIR=str(tmp_path / "audio"))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mediaserver",
        "--host",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--cert-dir",
        str(tmp_path / "none"),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await wait_healthy(f"http://127.0.0.1:{http_port}")
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    assert "HTTPS is off (run tools/gen_cert.py)" in output.decode()


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"MEDIASERVER_HTTP_PORT": "not-a-port"}, "MEDIASERVER_HTTP_PORT (http_port): Input should be a valid integer"),
        ({"MEDIASERVER_API_KEYS": "secret1"}, "MEDIASERVER_API_KEYS (api_keys) is not valid JSON"),
        # Half a Basic auth pair failed open (an operator trial): no auth at all, or any empty password.
        ({"MEDIASERVER_BASIC_AUTH_PASSWORD": "hunter2"}, "basic_auth_password is set but basic_auth_user is not"),
        ({"MEDIASERVER_BASIC_AUTH_USER": "admin"}, "basic_auth_user is set but basic_auth_password is not"),
        ({"MEDIASERVER_API_KEYS": '[""]'}, "api_keys has an empty key"),
        ({"MEDIASERVER_LOG_LEVEL": "verbose"}, "log_level must be DEBUG, INFO"),
    ],
    ids=["not-a-port", "not-json", "password-without-user", "user-without-password", "empty-key", "log-level"],
)
async def test_invalid_settings_exit_with_a_clear_message(variables: dict[str, str], named: str) -> None:
    env = dict(os.environ, **variables)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mediaserver",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 2, err
    assert b"invalid settings" in err and named.encode() in err, err
    assert b"Traceback" not in err and b"errors.pydantic.dev" not in err


async def test_a_certificate_that_cannot_be_used_is_one_line_before_anything_loads(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("not a key")
    env = dict(os.environ, MEDIASERVER_CERT_DIR=str(tmp_path), MEDIASERVER_WYOMING_ENABLED="false")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mediaserver", "--http-port", str(free_port()), cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    text = output.decode()
    assert process.returncode == 1, text
    assert "cannot start: the TLS certificate" in text and "MEDIASERVER_CERT_DIR" in text, text
    assert "Traceback" not in text and "Another program" not in text, text


async def test_a_taken_port_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(
            os.environ,
            MEDIASERVER_WYOMING_HOST="127.0.0.1",
            MEDIASERVER_WYOMING_PORT=str(port),
            MEDIASERVER_SAVE_AUDIO_DIR=str(tmp_path / "audio"),
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mediaserver",
            "--host",
            "127.0.0.1",
            "--http-port",
            str(free_port()),
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    text = output.decode()
    assert process.returncode == 1, text
    assert "cannot start" in text and "MEDIASERVER_WYOMING_PORT" in text
    assert "Traceback" not in text
