#!/usr/bin/env python3
"""What idle sessions cost the server: many paused WebRTC sessions, and hands-free ones with and
without Opus DTX.

1. **Paused (push-to-talk) sessions**: ``--sessions`` aiortc peers on loopback connect to a child
   server and pause their microphone track as the ``/rtc/`` page does between utterances
   (``replaceTrack(null)`` and an RTCP BYE), then stay connected for ``--hold-s``. Reported: the
   server's CPU over the hold (% of one core, and per 10 sessions), its RSS before and after the
   sessions opened (per idle session), and at the end whether every session still answers a new
   utterance (resume, speak, stop, transcript). Also counted, on the client side: datagrams per
   session per second each way (RTCP sender/receiver reports, STUN), which is what an idle session
   costs. The peers are aiortc's: a paused aiortc sender still sends a sender report every 0.5–1.5
   s and an ICE consent check every ~5 s. ``--browser-like`` makes them idle as Chrome does instead
   (libwebrtc's audio report interval is 5 s: reports every ~5 s while paused, and ICE checks every
   2.5 s), which is the load the /rtc page puts on the server. ``--tree`` runs the server from
   another source tree (``git archive main | tar -x -C /tmp/ms-main``), for a before/after.
2. **Hands-free sessions** (``--hands-free-pages``, needs Chromium): pages in headless Chromium
   listen hands-free to a silent fake microphone, once against a server that asks for Opus DTX and
   once against one that does not (``rtc_opus_dtx``). Reported per session: send bitrate from
   ``getStats`` and the server's CPU.

    python tools/bench_idle.py [--sessions 100] [--hold-s 600] [--browser-like] [--tree DIR]
                               [--hands-free-pages 3] [--hands-free-s 30]

Targets (issue #12): server CPU ≤ 0.5 % of a core per 10 idle sessions; every session answers at
the end. (issue #14): a hands-free session idles at ≤ 3 kbps with DTX.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, child_server

sys.path.insert(0, str(REPO))


class _Server:
    def __init__(self, url: str) -> None:
        self.url = url


def _cpu_s(process: Any) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


DATAGRAMS: collections.Counter[str] = collections.Counter()


def _kind(data: bytes) -> str:
    """RFC 7983's demultiplexing by first byte: STUN, DTLS (the data channel), RTP/RTCP."""
    if data[0] < 4:
        return "stun"
    if 128 <= data[0] <= 191:
        return (
            {200: "rtcp-sr", 201: "rtcp-rr", 203: "rtcp-bye"}.get(data[1], "rtcp") if 192 <= data[1] <= 223 else "rtp"
        )
    return "dtls" if 20 <= data[0] <= 63 else "other"


def _count_datagrams() -> None:
    """Count the client's datagrams by kind and direction (every send and receive of aioice's sockets)."""
    from aioice import ice

    received, sent = ice.StunProtocol.datagram_received, ice.StunProtocol.send_stun
    send_data = ice.StunProtocol.send_data

    def datagram_received(self: Any, data: Any, addr: Any) -> None:
        DATAGRAMS["server → client " + _kind(data)] += 1
        received(self, data, addr)

    def send_stun(self: Any, message: Any, addr: Any) -> None:
        DATAGRAMS["client → server stun"] += 1
        sent(self, message, addr)

    async def send_data_counted(self: Any, data: bytes, addr: Any) -> None:
        DATAGRAMS["client → server " + _kind(data)] += 1
        await send_data(self, data, addr)

    ice.StunProtocol.datagram_received = datagram_received  # type: ignore[method-assign]
    ice.StunProtocol.send_stun = send_stun  # type: ignore[method-assign]
    ice.StunProtocol.send_data = send_data_counted  # type: ignore[method-assign]


def _browser_like() -> None:
    """Make this process's aiortc peers idle as Chrome does: ICE checks every 2.5 s (aiortc: ~5 s);
    their reports are slowed per connection (``quiet_idle_reports``) once connected."""
    from aioice import ice

    setattr(ice, "CONSENT_INTERVAL", 2.5)  # noqa: B010 (an int constant, read at every check)


async def paused_sessions(url: str, pid: int, sessions: int, hold_s: float, browser_like: bool) -> dict[str, Any]:
    import psutil

    from mediaserver.transport.rtc_peer.patches import quiet_idle_reports
    from tests.conftest import SENTENCES, synthesize
    from tests.rtc_peer import Peer, connect

    _count_datagrams()
    if browser_like:
        _browser_like()
    # Before any session opens: synthesis blocks this loop for seconds, and a peer that sends
    # nothing for rtc_dead_peer_timeout_s is closed by the server.
    clip = synthesize(SENTENCES["kitchen"])
    server = psutil.Process(pid)
    rss_before = server.memory_info().rss
    cpu_start, wall_start = _cpu_s(server), time.monotonic()
    await asyncio.sleep(min(30.0, hold_s))
    idle_pct = 100.0 * (_cpu_s(server) - cpu_start) / (time.monotonic() - wall_start)
    peers: list[Peer] = []
    print(f"opening {sessions} WebRTC sessions…")
    for index in range(sessions):
        peer = await connect(_Server(url))
        if browser_like:
            quiet_idle_reports(peer.pc, 5.0)
        await peer.pause()
        peers.append(peer)
        if (index + 1) % 20 == 0:
            print(f"  {index + 1} open")
    await asyncio.sleep(5.0)  # DTLS/SCTP set-up traffic passes
    rss_after = server.memory_info().rss
    print(f"holding {sessions} paused sessions for {hold_s:.0f} s…")
    cpu_start, wall_start = _cpu_s(server), time.monotonic()
    DATAGRAMS.clear()
    await asyncio.sleep(hold_s)
    cpu_s, wall_s = _cpu_s(server) - cpu_start, time.monotonic() - wall_start
    datagrams = {kind: count / wall_s / sessions for kind, count in sorted(DATAGRAMS.items())}

    async def answers(peer: Peer) -> bool:
        peer.resume()
        peer.send("start")
        await peer.next("log")
        duration = peer.track.play(clip, silence_after_s=0.3)
        await asyncio.sleep(duration + 0.2)
        peer.send("stop")
        infer = await peer.next("infer", timeout=120)
        await peer.pause()
        return bool(infer["obj"]["text"].strip())

    print("every session answers one more utterance…")
    answered = 0
    for start in range(0, len(peers), 10):
        results = await asyncio.gather(*(answers(p) for p in peers[start : start + 10]), return_exceptions=True)
        answered += sum(r is True for r in results)
    for peer in peers:
        await peer.close()
    core_pct = 100.0 * cpu_s / wall_s
    return {
        "sessions": sessions,
        "browser_like": browser_like,
        "hold_s": wall_s,
        "server_cpu_pct_of_core": core_pct,
        "server_cpu_pct_without_sessions": idle_pct,
        "server_cpu_pct_per_10_sessions": core_pct / (sessions / 10),
        "rss_before_mb": rss_before / 2**20,
        "rss_after_mb": rss_after / 2**20,
        "rss_per_idle_session_kb": (rss_after - rss_before) / sessions / 1024,
        "answered_at_the_end": answered,
        "datagrams_per_session_per_s": datagrams,
        "load_average": psutil.getloadavg(),
    }


_BITRATE = """
async (ms) => {
  const client = window.mediaserver.client;
  const a = await client.sentBytes();
  await new Promise((resolve) => setTimeout(resolve, ms));
  const b = await client.sentBytes();
  const dt = b.timestamp - a.timestamp;
  return {seconds: dt / 1000, totalKbps: ((b.total - a.total) * 8) / dt};
}
"""


async def hands_free(pages: int, seconds: float, dtx: bool, silence_wav: Path) -> dict[str, Any]:
    import psutil
    from playwright.async_api import async_playwright

    from tests.e2e.conftest import CHROMIUM, chromium_args

    env = {"MEDIASERVER_RTC_OPUS_DTX": "true" if dtx else "false"}
    log_path = REPO / "bench-results" / f"bench-idle-server-dtx-{dtx}.log"
    with child_server(log_path, 180.0, env) as (url, process):
        server = psutil.Process(process.pid)
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=False, args=chromium_args(silence_wav)
            )
            context = await browser.new_context(permissions=["microphone"])
            opened = []
            for _ in range(pages):
                page = await context.new_page()
                await page.goto(f"{url}/rtc/")
                await page.wait_for_function("window.mediaserver !== undefined")
                await page.click("#connect")
                await page.wait_for_function("window.mediaserver.state.connected", timeout=30_000)
                await page.click("#hands-free")
                await page.wait_for_function("window.mediaserver.state.handsFree", timeout=5_000)
                opened.append(page)
            await asyncio.sleep(5.0)
            cpu_start, wall_start = _cpu_s(server), time.monotonic()
            rates = await asyncio.gather(*(p.evaluate(_BITRATE, int(seconds * 1000)) for p in opened))
            cpu_s, wall_s = _cpu_s(server) - cpu_start, time.monotonic() - wall_start
            await browser.close()
    kbps = [float(r["totalKbps"]) for r in rates]
    return {
        "dtx": dtx,
        "pages": pages,
        "seconds": wall_s,
        "send_kbps_per_session": sum(kbps) / len(kbps),
        "send_kbps_max": max(kbps),
        "server_cpu_pct_of_core_per_session": 100.0 * cpu_s / wall_s / pages,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if args.sessions:
        env = {"MEDIASERVER_MAX_SESSIONS": str(args.sessions + 10)}
        log_path = REPO / "bench-results" / "bench-idle-server.log"
        with child_server(log_path, 180.0, env, args.tree) as (url, process):
            results["paused"] = await paused_sessions(url, process.pid, args.sessions, args.hold_s, args.browser_like)
        paused = results["paused"]
        print(
            f"\npaused: {paused['sessions']} sessions for {paused['hold_s']:.0f} s: server CPU "
            f"{paused['server_cpu_pct_of_core']:.2f} % of a core ({paused['server_cpu_pct_per_10_sessions']:.3f} % "
            f"per 10 sessions; target ≤ 0.5 %; {paused['server_cpu_pct_without_sessions']:.2f} % with no session), "
            f"RSS {paused['rss_before_mb']:.0f} → {paused['rss_after_mb']:.0f} MB "
            f"({paused['rss_per_idle_session_kb']:.0f} KB per idle session), "
            f"{paused['answered_at_the_end']}/{paused['sessions']} answered at the end; "
            f"{'browser-like' if args.browser_like else 'aiortc'} clients, load {paused['load_average'][0]:.1f}"
        )
        for kind, rate in paused["datagrams_per_session_per_s"].items():
            print(f"  {kind:28s} {rate:6.3f} per session per s")
    if args.hands_free_pages:
        import numpy as np

        from tests.conftest import Clip

        silence = REPO / "bench-results" / "silence.wav"
        silence.parent.mkdir(exist_ok=True)
        silence.write_bytes(Clip("", np.zeros(22050 * 10, np.int16)).wav_bytes())
        results["hands_free"] = [
            await hands_free(args.hands_free_pages, args.hands_free_s, dtx, silence) for dtx in (True, False)
        ]
        for row in results["hands_free"]:
            print(
                f"hands-free, DTX {'on ' if row['dtx'] else 'off'}: {row['send_kbps_per_session']:.2f} kbps per "
                f"session (max {row['send_kbps_max']:.2f}), server CPU {row['server_cpu_pct_of_core_per_session']:.2f} "
                f"% of a core per session ({row['pages']} pages, {row['seconds']:.0f} s)"
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100, help="paused WebRTC sessions (0 skips)")
    parser.add_argument("--hold-s", type=float, default=600.0)
    parser.add_argument("--browser-like", action="store_true", help="clients idle as Chrome does (see above)")
    parser.add_argument("--tree", type=Path, default=REPO, help="the server's source tree")
    parser.add_argument("--hands-free-pages", type=int, default=3, help="Chromium pages per DTX setting (0 skips)")
    parser.add_argument("--hands-free-s", type=float, default=30.0)
    parser.add_argument("--json", type=Path, default=REPO / "bench-results" / "bench-idle.json")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    args.json.parent.mkdir(exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
