"""The examples of README.md and docs/*.md run as typed against a live server, so the docs cannot lie.

- Every command of a ```sh block is either run here (the curl examples against
  ``localhost:19001``) or named in ``NOT_RUN`` with the reason it cannot run in a test. A new
  example that is neither fails the test, so the docs cannot grow an example nobody ran.
- A ```python block right after an HTML comment ``<!-- test: ... -->`` is run as a script; the
  comment may say ``expect="words"`` (each must be in what it prints) and ``args="..."`` (its
  command line). Other python blocks are fragments and are not run.

Each runs in its own directory holding ``speech.wav`` (Piper saying "Turn on the kitchen lights and
close the garage door"), with only the addresses replaced: ``localhost:19001`` by the test server's,
and Wyoming's ``"localhost", 10300`` by its Wyoming port. curl reads a ``.curlrc`` from
``$CURL_HOME``: the one written here adds ``--fail`` (an HTTP error is a non-zero exit) and
``--silent --show-error``, so the command line itself stays as typed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mediaserver.transport.wyoming.server import WYOMING_PORT
from tests.conftest import SENTENCES, write_wav

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ADDRESS = "localhost:19001"
WYOMING_ADDRESS = '"localhost", 10300'

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
    'MEDIASERVER_REMOTE_MODELS=\'{"large": {"backend": "openai", "url": "http://vllm:8000/v1", '
    '"model": "openai/whisper-large-v3", "max_concurrency": 32}}\'': "a setting for a vLLM host, not a command",
    "MEDIASERVER_ASR_DEFAULT_MODEL=large": "a setting, not a command",
    'MEDIASERVER_MCP_SERVERS=\'[ {"name": "ha", "url": "http://homeassistant.local:8123/api/mcp", '
    '"headers": {"Authorization": "Bearer <long-lived access token>"}}, {"name": "files", "command": "npx", '
    '"args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/notes"]} ]\'': "a setting naming a Home "
    "Assistant host and an npx MCP server (tests/integration/test_mcp_tools.py runs real MCP servers)",
    "python tools/gen_cert.py mediaserver.lan 192.168.1.20": "writes certs/ of the checkout; "
    "tests/unit/test_gen_cert.py runs the tool",
    "apt-get install python3.11-venv": "installs a system package",
    "/usr/bin/python3.11 -m venv .triton-venv": "the Triton venv; tests/integration/test_triton.py makes one",
    ".triton-venv/bin/pip install -r tools/triton-requirements.txt": "the Triton venv (test_triton.py)",
    ".triton-venv/bin/python tools/triton_whisper_server.py --model-dir /path/to/ct2-whisper --http-port 8000 "
    "--grpc-port 8001 --metrics-port 8002": "a Triton server (test_triton.py starts one)",
    "docker compose -f deploy/docker-compose.yml up -d": "needs Docker and GPUs",
    "docker compose -f deploy/docker-compose.yml --profile triton up -d": "needs Docker and GPUs",
    "curl -F name=alice -F file=@one.wav -F file=@two.wav -F file=@three.wav http://localhost:19001/api/speakers": (
        "needs three recordings of one person; tests/integration/test_speakers.py enrols real voices"
    ),
    "curl http://localhost:19001/api/speakers": "lists the enrolled speakers (test_speakers.py)",
    "curl -X DELETE http://localhost:19001/api/speakers/alice": "needs alice enrolled (test_speakers.py)",
}


def _open_quote(command: str) -> bool:
    try:
        shlex.split(command)
    except ValueError:  # "No closing quotation"
        return True
    return False


def shell_commands(markdown: str) -> list[str]:
    """Each command of each ```sh block: continuation lines joined, comments and blanks dropped."""
    commands: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", markdown, flags=re.DOTALL | re.MULTILINE):
        pending = ""
        for line in block.splitlines():
            stripped = re.sub(r"\s+# .*$", "", line.strip())  # a comment after the command
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


@dataclass(frozen=True)
class Script:
    where: str  # page:line
    code: str
    expect: tuple[str, ...]
    args: tuple[str, ...]


def python_scripts(path: Path) -> list[Script]:
    """The ```python blocks marked ``<!-- test: expect="..." args="..." -->`` on the line before."""
    text = path.read_text(encoding="utf-8")
    scripts = []
    for match in re.finditer(r"^<!-- test:(.*?)-->\n```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE):
        options = dict(re.findall(r'(\w+)="([^"]*)"', match[1]))
        unknown = set(options) - {"expect", "args"}
        line = text.count("\n", 0, match.start()) + 1
        assert not unknown, f"{path.name}:{line}: unknown test options {unknown}"
        scripts.append(
            Script(
                f"{path.relative_to(ROOT)}:{line}",
                match[2],
                tuple(options.get("expect", "").lower().split()),
                tuple(shlex.split(options.get("args", ""))),
            )
        )
    return scripts


COMMANDS = list(dict.fromkeys(c for page in PAGES for c in shell_commands(page.read_text(encoding="utf-8"))))
CURL_COMMANDS = [c for c in COMMANDS if c.startswith("curl ") and c not in NOT_RUN]
SCRIPTS = [script for page in PAGES for script in python_scripts(page)]


def test_every_example_is_run_or_skipped_with_a_reason() -> None:
    assert CURL_COMMANDS and SCRIPTS, "no examples found: the extraction is broken"
    unaccounted = [c for c in COMMANDS if c not in CURL_COMMANDS and c not in NOT_RUN]
    assert not unaccounted, f"shell examples neither run by this test nor in NOT_RUN: {unaccounted}"
    stale = [c for c in NOT_RUN if c not in COMMANDS]
    assert not stale, f"NOT_RUN names commands the docs no longer have: {stale}"
    for command in CURL_COMMANDS:
        assert ADDRESS in command, command
        shlex.split(command)  # balanced quotes
    for script in SCRIPTS:
        assert ADDRESS in script.code or WYOMING_ADDRESS in script.code, script.where
        compile(script.code, script.where, "exec")
    # Every face's first request in the README is run.
    readme = [s.code for s in SCRIPTS if s.where.startswith("README.md")]
    for face in ("audio.transcriptions", "realtime.connect", "/api/ws/asr", "AsyncTcpClient"):
        assert any(face in code for code in readme), f"the README's {face} example is not marked to run"


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
    if any(path in command for path in ("/api/asr", "/api/willow", "/v1/audio/transcriptions")):
        words = set(re.findall(r"[a-z]+", body["text"].lower()))
        assert {"kitchen", "lights", "garage"} <= words, body
    elif "/v1/chat/completions" in command:
        assert body["object"] == "chat.completion", body
        assert body["choices"][0]["message"]["content"].strip(), body
    else:
        raise AssertionError(f"no check for this example; add one: {command}")


async def _run(argv: list[str], workdir: Path, env: dict[str, str]) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=workdir, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(120):
            stdout, stderr = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, (argv, proc.returncode, stderr.decode(errors="replace"))
    return stdout.decode(), stderr.decode(errors="replace")


@pytest.mark.parametrize("command", CURL_COMMANDS)
async def test_curl_example_runs_as_typed(command: str, server: Any, tmp_path: Path) -> None:
    write_wav(str(tmp_path / "speech.wav"), SENTENCES["kitchen"])
    (tmp_path / ".curlrc").write_text("fail\nsilent\nshow-error\n")
    live = command.replace(ADDRESS, f"{server.host}:{server.port}")
    env = {"PATH": "/usr/bin:/bin", "CURL_HOME": str(tmp_path), "HOME": str(tmp_path)}
    stdout, _ = await _run(["bash", "-c", live], tmp_path, env)
    _check_output(command, stdout, tmp_path)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.where for s in SCRIPTS])
async def test_python_example_runs_as_typed(script: Script, server: Any, tmp_path: Path) -> None:
    write_wav(str(tmp_path / "speech.wav"), SENTENCES["kitchen"])
    code = script.code.replace(ADDRESS, f"{server.host}:{server.port}")
    code = code.replace(WYOMING_ADDRESS, f'"{server.host}", {server.app[WYOMING_PORT]}')
    (tmp_path / "example.py").write_text(code)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "NO_PROXY": "*"}
    stdout, stderr = await _run([sys.executable, "example.py", *script.args], tmp_path, env)
    assert stdout.strip(), (script.where, stderr)
    words = set(re.findall(r"[a-z]+", stdout.lower()))
    missing = [word for word in script.expect if word not in words]
    assert not missing, (script.where, missing, stdout)
