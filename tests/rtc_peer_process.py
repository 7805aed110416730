"""A WebRTC client in a process of its own, for tests that kill it (SIGKILL) in the middle of a session:
the server then sees what it sees when a browser tab crashes or a laptop loses its network.

``python tests/rtc_peer_process.py URL`` connects to ``URL/api/rtc/asr`` (an audio track playing
silence and the WIS data channel), waits for the channel to open and a ``ping`` to be answered,
prints ``ready`` and then just stays connected until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack


async def main(url: str) -> None:
    pc = RTCPeerConnection()
    channel = pc.createDataChannel("chat", ordered=True)
    pc.addTrack(AudioStreamTrack())  # silence at real time, like an open microphone in a quiet room
    pong: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @channel.on("open")
    def on_open() -> None:
        channel.send(json.dumps({"type": "ping", "message": "alive", "obj": None}))

    @channel.on("message")
    def on_message(data: str) -> None:
        if json.loads(data).get("type") == "pong" and not pong.done():
            pong.set_result(None)

    await pc.setLocalDescription(await pc.createOffer())
    async with aiohttp.ClientSession() as http:
        offer = {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type}
        async with http.post(f"{url}/api/rtc/asr", json=offer) as resp:
            resp.raise_for_status()
            answer = await resp.json()
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
    await asyncio.wait_for(pong, timeout=30)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
