"""The README's shell examples run as typed against a live server.

Every command in a ```sh block of README.md is either run here (the curl examples, with only
``localhost:19001`` replaced by the test server's address, in a directory holding a Piper
``speech.wav``) or named in ``NOT_RUN`` with the reason it cannot run in a test. A new example
that is neither fails the test, so the README cannot grow an example nobody ran.

curl reads a ``.curlrc`` from ``$CURL_HOME``: the one written here adds ``--fail`` (an HTTP error
is a non-zero exit) and ``--silent --show-error``, so the command line itself stays as typed.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SENTENCES, write_wav

README = Path(__file__).resolve().parents[2] / "README.md"
README_ADDRESS = "localhost:19001"

NOT_RUN = {
    "make run": "builds .venv and starts a server on the fixed port 19001; the test servers are already running",
    "make test": "runs the whole suite (this test included)",
    'python -m mediaserver.mint_secret --server http://localhost:19001 --api-key "$KEY" --ttl 600': "needs a "
    "server with auth on; tests/integration/test_rtc_page_secret.py runs this command against one",
    "MEDIASERVER_LLM_UPSTREAM_URL=http://gpu-box:8000/v1 make run": "needs a vLLM host",
    "MEDIASERVER_LLM_UPSTREAM_URL=http://localhost:11434/v1 "
    "MEDIASERVER_LLM_UPSTREAM_MODELS='[\"llama3.2\"]' make run": "needs Ollama",
    "MEDIASERVER_LLM_UPSTREAM_URL=https://api.openai.com/v1 MEDIASERVER_LLM_UPSTREAM_API_KEY=sk-... "
    "MEDIASERVER_LLM_UPSTREAM_MODELS='[\"gpt-4o-mini\"]' make run": "needs an OpenAI key and the internet",
    'MEDIASERVER_REMOTE_MODELS=\'{"tiny.en": {"backend": "triton", '
    '"url": "grpc://triton:8001", "multilingual": false}}\'': "a setting for a Triton host, not a command",
    'MEDIASERVER_MCP_SERVERS=\'[ {"name": "ha", "url": "http://homeassistant.local:8123/api/mcp", '
    '"headers": {"Authorization": "Bearer <long-lived access token>"}}, {"name": "files", "command": "npx", '
    '"args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/notes"]} ]\'': "a setting naming a Home "
    "Assistant host and an npx MCP server (tests/integration/test_mcp_tools.py runs real MCP servers)",
}


def shell_commands(markdown: str) -> list[str]:
    """Each command of each ```sh block: continuation lines joined, comments and blanks dropped."""
    commands: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", markdown, flags=re.DOTALL | re.MULTILINE):
        pending = ""
        for line in block.splitlines():
            stripped = line.strip()
            if not pending and (not stripped or stripped.startswith("#")):
                continue
            if stripped.endswith("\\"):
                pending += stripped[:-1].rstrip() + " "
                continue
            if _open_quote(pending + stripped):  # a quoted value over several lines: one command
                pending += stripped + " "
                continue
            commands.append(pending + stripped)
            pending = ""
        assert not pending, f"a ```sh block ends in a continuation: {pending!r}"
    return commands


def _open_quote(command: str) -> bool:
    try:
        shlex.split(command)
    except ValueError:  # "No closing quotation"
        return True
    return False


COMMANDS = shell_commands(README.read_text(encoding="utf-8"))
CURL_COMMANDS = [c for c in COMMANDS if c.startswith("curl ")]


def test_every_example_is_run_or_skipped_with_a_reason() -> None:
    assert CURL_COMMANDS, "no curl examples found: the extraction is broken"
    unaccounted = [c for c in COMMANDS if c not in CURL_COMMANDS and c not in NOT_RUN]
    assert not unaccounted, f"README shell examples neither run by this test nor in NOT_RUN: {unaccounted}"
    stale = [c for c in NOT_RUN if c not in COMMANDS]
    assert not stale, f"NOT_RUN names commands the README no longer has: {stale}"
    for command in CURL_COMMANDS:
        assert README_ADDRESS in command, command
        shlex.split(command)  # balanced quotes


def _check_output(command: str, stdout: str, workdir: Path) -> None:
    """What each example should have produced: a transcript, an answer, a WAV file."""
    if "/api/tts" in command:
        out = workdir / shlex.split(command)[shlex.split(command).index("-o") + 1]
        data = out.read_bytes()
        assert data[:4] == b"RIFF" and data[8:12] == b"WAVE" and len(data) > 1000, data[:64]
        return
    if "stream=true" in command:  # server-sent events: the deltas, then the done event with the text
        events = [json.loads(line[6:]) for line in stdout.splitlines() if line.startswith("data: ")]
        assert events and events[-1]["type"] == "transcript.text.done", stdout
        assert "".join(e["delta"] for e in events[:-1]) == events[-1]["text"], events
        stdout = json.dumps(events[-1])
    body: Any = json.loads(stdout)
    if "/api/asr" in command or "/v1/audio/transcriptions" in command:
        words = set(re.findall(r"[a-z]+", body["text"].lower()))
        assert {"kitchen", "lights", "garage"} <= words, body
    elif "/v1/chat/completions" in command:
        assert body["object"] == "chat.completion", body
        assert body["choices"][0]["message"]["content"].strip(), body
    else:
        raise AssertionError(f"no check for this example; add one: {command}")


@pytest.mark.parametrize("command", CURL_COMMANDS)
async def test_curl_example_runs_as_typed(command: str, server: Any, tmp_path: Path) -> None:
    write_wav(str(tmp_path / "speech.wav"), SENTENCES["kitchen"])
    (tmp_path / ".curlrc").write_text("fail\nsilent\nshow-error\n")
    live = command.replace(README_ADDRESS, f"{server.host}:{server.port}")
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        live,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "CURL_HOME": str(tmp_path), "HOME": str(tmp_path)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=150)
    assert proc.returncode == 0, (command, proc.returncode, stderr.decode(errors="replace"))
    _check_output(command, stdout.decode(), tmp_path)
