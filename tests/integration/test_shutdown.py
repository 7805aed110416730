"""Shutdown of a real ``python -m mediaserver`` process with clients connected.

On SIGTERM, open streaming sessions are closed at once: WebSockets with 1001 (docs/ws-protocol.md
"Close codes"), a WebRTC peer is hung up, Wyoming's idle connections get EOF; the process exits
promptly and nothing is logged at ERROR.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest

from tests.ports import free_port
from tests.processes import mediaserver_process, wait_http_ok
from tests.rtc_peer import Peer
from tests.rtc_peer import connect as rtc_connect

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Generous: the machine may be loaded. Without the fix the sessions stayed open ~30 s.
EXIT_BOUND_S = 15.0


async def _close_code(ws: aiohttp.ClientWebSocketResponse) -> int | None:
    """Read until the server closes; the close code it sent."""
    while True:
        msg = await ws.receive()
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            return ws.close_code


async def _peer_closed(peer: Peer) -> None:
    """Until the server's hang-up reaches the WebRTC peer (its data channel closes)."""
    while peer.channel.readyState != "closed":
        await asyncio.sleep(0.05)


async def test_sigterm_closes_sessions_with_1001_and_exits_without_error(tmp_path: Path) -> None:
    wyoming_port = free_port()
    managed, url = mediaserver_process(
        tmp_path,
        wyoming_enabled="true",
        wyoming_host="127.0.0.1",
        wyoming_port=str(wyoming_port),
        llm_enabled="false",
    )
    managed.start()
    try:
        await wait_http_ok(f"{url}/health", process=managed.process)
        reader, writer = await asyncio.open_connection("127.0.0.1", wyoming_port)
        async with aiohttp.ClientSession() as http:
            device = await http.ws_connect(f"{url}/api/ws/asr")
            await device.send_json({"type": "start"})
            ready = json.loads((await device.receive(timeout=30)).data)
            assert ready["type"] == "ready", ready
            realtime = await http.ws_connect(f"{url}/v1/realtime?intent=transcription")
            created = json.loads((await realtime.receive(timeout=30)).data)
            assert created["type"].endswith("session.created"), created
            peer = await rtc_connect(SimpleNamespace(url=url))

            started = time.monotonic()
            os.killpg(managed.pid, signal.SIGTERM)
            try:
                device_code, realtime_code, wyoming_rest, _ = await asyncio.wait_for(
                    asyncio.gather(_close_code(device), _close_code(realtime), reader.read(), _peer_closed(peer)),
                    EXIT_BOUND_S,
                )
            finally:
                await peer.close()
            closed_after_s = time.monotonic() - started
        writer.close()
        assert device_code == 1001
        assert realtime_code == 1001
        assert wyoming_rest == b""  # EOF, nothing else
        assert managed.process is not None
        exit_code = await asyncio.get_running_loop().run_in_executor(None, managed.process.wait, EXIT_BOUND_S)
        exited_after_s = time.monotonic() - started
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit within {EXIT_BOUND_S} s of SIGTERM:\n{managed.output()}")
    finally:
        managed.stop()
    log = managed.output()
    print(f"sessions closed {closed_after_s:.2f} s and the process exited {exited_after_s:.2f} s after SIGTERM")
    assert exit_code == 0, log
    assert closed_after_s < EXIT_BOUND_S and exited_after_s < EXIT_BOUND_S
    assert " ERROR " not in log and "Traceback" not in log, log
    assert "the client closed the connection" not in log, log
    assert log.count("(code 1001)") == 2, log
    assert "closing 3 open session(s)" in log, log
    assert re.search(r"session rtc-\w+: closed", log), log
