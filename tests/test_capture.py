"""Capture: friend links written to pcap files as the TCP segments their
connections would carry, read back with dpkt (and tshark).

Every capture a test makes is read back whole: each segment's checksums
are recomputed independently, each direction's sequence numbers must run on
without a gap or an overlap, every acknowledgement must name exactly what
the other side had sent by then, the handshake comes first and nothing
follows a reset; reassembled, each direction must be the bytes its end
wrote (or, after an abort or a reset, the bytes its friend received).
"""

from __future__ import annotations

import array
import asyncio
import dataclasses
import logging
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
from typing import Dict, List, Optional, Tuple

import dpkt
import pytest
import trio

import friendsock
from friendsock._core import _pcap
from friendsock._core._channel import Channel
from friendsock._core._locked_channel import LockedChannel
from support import Recorder, chunked, connected_pair, port_of
from test_threads import EchoUntilEof, Factory, ThreadRecorder, close_server, make_server, other  # noqa: F401
from trio_support import nothing_left_behind, receive_until_eof, stream_pair  # noqa: F401

MiB = 1 << 20
TIMEOUT = 30

# CI installs tshark (.ci/run sets FRIENDSOCK_TEST_TSHARK=required); elsewhere
# the tshark half of a check runs where tshark is installed.
TSHARK = shutil.which("tshark")
TSHARK_REQUIRED = os.environ.get("FRIENDSOCK_TEST_TSHARK") == "required"


# -- reading a capture back ---------------------------------------------------------


def reference_ones_sum(data: bytes) -> int:
    """RFC 1071, word by word: independent of the library's big-integer way."""
    if len(data) % 2:
        data += b"\0"
    words = array.array("H", data)
    if sys.byteorder == "little":
        words.byteswap()
    total = sum(words)
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


@dataclasses.dataclass
class Direction:
    data: bytearray = dataclasses.field(default_factory=bytearray)
    next_seq: Optional[int] = None
    segments: int = 0
    fin: bool = False
    rst: bool = False


@dataclasses.dataclass
class Stream:
    """One TCP connection found in a capture, checked as it was read."""

    client: Tuple[str, int]
    server: Tuple[str, int]
    up: Direction = dataclasses.field(default_factory=Direction)  # client to server
    down: Direction = dataclasses.field(default_factory=Direction)  # server to client
    events: List[Tuple[str, str]] = dataclasses.field(default_factory=list)  # (who, flags)
    handshake: bool = False


def _flag_names(flags: int) -> str:
    names = [name for bit, name in ((_pcap.SYN, "S"), (_pcap.FIN, "F"), (_pcap.RST, "R"),
                                    (_pcap.PSH, "P"), (_pcap.ACK, "A")) if flags & bit]
    return "".join(names)


def read_capture(*paths: str) -> Dict[Tuple[Tuple[str, int], Tuple[str, int]], Stream]:
    """The TCP streams in ``paths`` (files of one capture, in order), keyed
    by (client, server) address, every segment checked on the way."""
    streams: Dict[Tuple[Tuple[str, int], Tuple[str, int]], Stream] = {}
    for path in paths:
        with open(path, "rb") as f:
            reader = dpkt.pcap.Reader(f)
            assert reader.datalink() == dpkt.pcap.DLT_EN10MB
            for _ts, frame in reader:
                _check_segment(streams, frame)
    return streams


def _check_segment(streams, frame: bytes) -> None:
    eth = dpkt.ethernet.Ethernet(frame)
    ip = eth.data
    if isinstance(ip, dpkt.ip.IP):
        assert len(bytes(ip)) <= 65535
        assert reference_ones_sum(bytes(ip)[:ip.hl * 4]) == 0xFFFF, "IPv4 header checksum"
        src, dst = socket.inet_ntop(socket.AF_INET, ip.src), socket.inet_ntop(socket.AF_INET, ip.dst)
        tcp_bytes = bytes(ip)[ip.hl * 4:]
        pseudo = ip.src + ip.dst + struct.pack("!BBH", 0, 6, len(tcp_bytes))
    else:
        assert isinstance(ip, dpkt.ip6.IP6)
        assert 40 + ip.plen <= 65535
        src, dst = socket.inet_ntop(socket.AF_INET6, ip.src), socket.inet_ntop(socket.AF_INET6, ip.dst)
        tcp_bytes = bytes(ip)[40:]
        pseudo = ip.src + ip.dst + struct.pack("!IxxxB", len(tcp_bytes), 6)
    assert reference_ones_sum(pseudo + tcp_bytes) == 0xFFFF, "TCP checksum"
    tcp = ip.data
    a, b = (src, tcp.sport), (dst, tcp.dport)
    flags = tcp.flags
    if flags & _pcap.SYN and not flags & _pcap.ACK:
        assert (a, b) not in streams or streams[(a, b)].down.rst or streams[(a, b)].down.fin
        streams[(a, b)] = stream = Stream(a, b)
        stream.up.next_seq = (tcp.seq + 1) & 0xFFFFFFFF
        stream.events.append(("client", _flag_names(flags)))
        return
    if (a, b) in streams:
        stream, who = streams[(a, b)], "client"
        me, peer = stream.up, stream.down
    else:
        assert (b, a) in streams, f"a segment of a connection with no handshake: {a} -> {b}"
        stream, who = streams[(b, a)], "server"
        me, peer = stream.down, stream.up
    assert not (stream.up.rst or stream.down.rst), "a segment after a reset"
    stream.events.append((who, _flag_names(flags)))
    if flags & _pcap.SYN:  # the SYN-ACK
        assert who == "server" and me.next_seq is None
        assert tcp.ack == stream.up.next_seq
        me.next_seq = (tcp.seq + 1) & 0xFFFFFFFF
        return
    if not stream.handshake:
        assert who == "client" and flags == _pcap.ACK and tcp.ack == stream.down.next_seq
        stream.handshake = True
        return
    assert tcp.seq == me.next_seq, f"{who}: seq {tcp.seq} where {me.next_seq} was next"
    assert not me.fin or not tcp.data, f"{who}: data after its FIN"
    if flags & _pcap.ACK:
        assert tcp.ack == peer.next_seq, f"{who}: ack {tcp.ack}, but {peer.next_seq} was sent"
    me.data += tcp.data
    me.segments += bool(tcp.data)
    me.next_seq = (me.next_seq + len(tcp.data) + bool(flags & _pcap.FIN)) & 0xFFFFFFFF
    me.fin |= bool(flags & _pcap.FIN)
    me.rst |= bool(flags & _pcap.RST)


def only_stream(path: str) -> Stream:
    streams = read_capture(path)
    assert len(streams) == 1, streams.keys()
    (stream,) = streams.values()
    return stream


def stream_of(streams, transport: asyncio.BaseTransport) -> Stream:
    """The stream of the connection whose client end is ``transport``."""
    client = transport.get_extra_info("sockname")[:2]
    server = transport.get_extra_info("peername")[:2]
    return streams[((client[0], client[1]), (server[0], server[1]))]


def tshark_check(path: str, expected: Dict[int, Tuple[bytes, bytes]]) -> None:
    """tshark, with checksum validation on, reports no errors, and follows
    each stream (by tshark's index: the order of the handshakes) to exactly
    (client to server, server to client)."""
    if TSHARK is None:
        if TSHARK_REQUIRED:
            pytest.fail("tshark is required here but not installed")
        return
    # Nothing above TCP is dissected: a protocol registered on a port the
    # connection happened to take would read its bytes as malformed.
    prefs = ["-o", "tcp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE",
             "-o", "tcp.analyze_sequence_numbers:TRUE",
             "-d", "tcp.port==1-65535,data"]
    run = subprocess.run([TSHARK, "-n", "-r", path, *prefs, "-q", "-z", "expert,error"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "Errors (" not in run.stdout, run.stdout
    for index, (up, down) in expected.items():
        run = subprocess.run([TSHARK, "-n", "-r", path, *prefs, "-q", "-z", f"follow,tcp,raw,{index}"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        start = max(i for i, line in enumerate(lines) if line.startswith("Node 1:")) + 1
        body = [line for line in lines[start:] if line.strip() and not line.startswith("=")]
        got_up = bytes.fromhex("".join(line for line in body if not line.startswith("\t")))
        got_down = bytes.fromhex("".join(line.strip() for line in body if line.startswith("\t")))
        assert (len(got_up), len(got_down)) == (len(up), len(down))
        assert got_up == up and got_down == down


def check_tcp_shape(stream: Stream, *, closed_by_fins: bool = True) -> None:
    """The connection opened with a three-way handshake; ended by a FIN
    each way (acknowledged) unless a reset ended it."""
    assert stream.events[:3] == [("client", "S"), ("server", "SA"), ("client", "A")]
    assert stream.handshake
    if closed_by_fins:
        assert stream.up.fin and stream.down.fin and not (stream.up.rst or stream.down.rst)
        assert stream.events[-1][1] == "A"  # the last FIN was acknowledged


# -- the sans-IO format ---------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 2, 3, 1499, 65494, 65495, 65496, 200_001])
def test_checksums_match_rfc_1071_word_by_word(size):
    data = random.Random(size).randbytes(size)
    assert _pcap.ones_sum(data) % 0xFFFF == reference_ones_sum(data) % 0xFFFF
    assert _pcap.ones_sum(b"\xff" * size) % 0xFFFF == reference_ones_sum(b"\xff" * size) % 0xFFFF


@pytest.mark.parametrize("client, server, mss", [
    (("127.0.0.1", 40000), ("127.0.0.1", 8080), 65495),
    (("::1", 40000, 0, 0), ("::1", 8080, 0, 0), 65475),
    (("::ffff:127.0.0.1", 40000, 0, 0), ("127.0.0.1", 8080), 65495),  # a dual-stack end
])
def test_segments_fit_in_an_ip_packet_and_sequence_numbers_wrap(tmp_path, client, server, mss):
    flow = _pcap.TcpFlow(client, server, client_isn=0xFFFFFFF0, server_isn=7)
    assert flow.mss == mss
    payload = random.Random(3).randbytes(3 * mss + 5)
    records = flow.handshake(1_700_000_000_123_456_789)
    records += flow.data(_pcap.CLIENT, payload, 1_700_000_000_223_456_789)
    records += flow.data(_pcap.SERVER, b"r" * 3, 1_700_000_000_323_456_789)
    records += flow.fin(_pcap.CLIENT, 1_700_000_000_423_456_789)
    records += flow.reset(_pcap.SERVER, 1_700_000_000_523_456_789)
    path = tmp_path / "flow.pcap"
    path.write_bytes(_pcap.FILE_HEADER + b"".join(records))
    stream = only_stream(str(path))
    assert stream.up.data == payload and stream.down.data == b"rrr"
    assert stream.up.segments == 4  # three full segments and the rest
    assert stream.up.fin and stream.down.rst
    with open(path, "rb") as f:
        times = [ts for ts, _ in dpkt.pcap.Reader(f)]
    assert times[0] == pytest.approx(1_700_000_000.123456)
    assert times[-1] == pytest.approx(1_700_000_000.523456)


# -- asyncio and uvloop links ----------------------------------------------------------


async def exchange(transport, client, server, up: bytes, down: bytes, rng: random.Random) -> None:
    """Both ends write at once (random pieces), then a half-close each way."""
    for chunk in chunked(down, rng, largest=256 * 1024):
        server.transport.write(chunk)
    server.transport.write_eof()
    for chunk in chunked(up, rng, largest=256 * 1024):
        transport.write(chunk)
    transport.write_eof()
    await asyncio.wait_for(asyncio.gather(client.eof, server.eof), TIMEOUT)
    transport.close()
    server.transport.close()
    await asyncio.wait_for(asyncio.gather(client.lost, server.lost), TIMEOUT)


@pytest.mark.parametrize("seed", [1, 2, "16MiB"])
async def test_each_direction_reassembles_to_what_was_written(tmp_path, seed):
    rng = random.Random(seed)
    if seed == "16MiB":
        up, down = rng.randbytes(16 * MiB), rng.randbytes(rng.randint(1, 16 * MiB))
    else:
        up, down = rng.randbytes(rng.randint(1, 16 * MiB)), rng.randbytes(rng.randint(1, MiB))
    path = str(tmp_path / "both.pcap")
    with friendsock.capture(path) as running:
        async with connected_pair(True, client_protocol=lambda: Recorder(eof_keep_open=True),
                                  server_protocol=lambda: Recorder(eof_keep_open=True)) as (
                transport, client, server):
            await exchange(transport, client, server, up, down, rng)
    assert client.data == down and server.data == up
    assert running.closed and running.links == 1 and running.paths == [path]
    stream = only_stream(path)
    check_tcp_shape(stream)
    assert stream.client == transport.get_extra_info("sockname")[:2]
    assert stream.server == transport.get_extra_info("peername")[:2]
    assert stream.up.data == up and stream.down.data == down
    tshark_check(path, {0: (up, down)})


async def test_ipv6_links_are_ipv6_segments(tmp_path):
    path = str(tmp_path / "v6.pcap")
    with friendsock.capture(path):
        async with connected_pair(True, host="::1", client_protocol=lambda: Recorder(True),
                                  server_protocol=lambda: Recorder(True)) as (transport, client, server):
            await exchange(transport, client, server, b"up" * 40_000, b"down", random.Random(4))
    stream = only_stream(path)
    assert stream.client[0] == stream.server[0] == "::1"
    check_tcp_shape(stream)
    assert stream.up.data == b"up" * 40_000 and stream.down.data == b"down"
    tshark_check(path, {0: (b"up" * 40_000, b"down")})


async def test_half_close_shows_the_fin_before_the_reply(tmp_path):
    path = str(tmp_path / "half.pcap")
    with friendsock.capture(path):
        async with connected_pair(True, server_protocol=lambda: Recorder(eof_keep_open=True)) as (
                transport, client, server):
            transport.write(b"question")
            transport.write_eof()
            await asyncio.wait_for(server.eof, TIMEOUT)
            server.transport.write(b"answer after your FIN")
            server.transport.close()
            assert await asyncio.wait_for(client.lost, TIMEOUT) is None
    stream = only_stream(path)
    check_tcp_shape(stream)
    assert stream.up.data == b"question" and stream.down.data == b"answer after your FIN"
    # Data, FIN (acknowledged), then the reply and the server's FIN.
    assert stream.events[3:] == [("client", "PA"), ("server", "A"), ("client", "FA"), ("server", "A"),
                                 ("server", "PA"), ("client", "A"), ("server", "FA"), ("client", "A")]
    tshark_check(path, {0: (b"question", b"answer after your FIN")})


async def test_abort_with_unread_bytes_sends_a_reset_after_what_fit(tmp_path):
    """The aborting end had unread incoming bytes: its kernel sends RST.
    Only what fit in its receive buffer ever crossed the wire."""
    path = str(tmp_path / "rst.pcap")
    with friendsock.capture(path):
        async with connected_pair(True) as (transport, client, server):
            transport.pause_reading()
            rcvbuf = transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            payload = random.Random(5).randbytes(3 * rcvbuf)
            server.transport.write(payload)
            transport.write(b"last words")
            await asyncio.wait_for(server.wait_bytes(10), TIMEOUT)
            transport.abort()
            assert isinstance(await asyncio.wait_for(server.lost, TIMEOUT), ConnectionResetError)
    stream = only_stream(path)
    check_tcp_shape(stream, closed_by_fins=False)
    assert stream.up.data == b"last words"
    assert stream.down.data == payload[:rcvbuf]
    assert stream.events[-1] == ("client", "RA") and not stream.up.fin and not stream.down.fin
    tshark_check(path, {0: (b"last words", payload[:rcvbuf])})


async def test_abort_without_unread_bytes_sends_what_the_kernel_held_then_fin(tmp_path):
    """An abort drops the writer's own buffer; what sndbuf + friend rcvbuf
    held still goes, as the reader makes room, then the FIN."""
    path = str(tmp_path / "abort.pcap")
    with friendsock.capture(path):
        async with connected_pair(True) as (transport, client, server):
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            server.transport.pause_reading()
            payload = random.Random(6).randbytes(2 * MiB)
            for chunk in chunked(payload, random.Random(7), largest=100_000):
                transport.write(chunk)
            transport.abort()
            server.transport.resume_reading()
            assert await asyncio.wait_for(server.lost, TIMEOUT) is None
    stream = only_stream(path)
    assert 0 < len(server.data) < len(payload) and server.events[-2:] == ["eof", "lost"]
    assert stream.up.data == server.data == payload[:len(server.data)]
    assert stream.up.fin
    tshark_check(path, {0: (bytes(server.data), b"")})


async def test_a_write_to_a_friend_that_closed_goes_out_and_is_answered_with_a_reset(tmp_path):
    path = str(tmp_path / "refused.pcap")
    with friendsock.capture(path):
        async with connected_pair(True, client_protocol=lambda: Recorder(eof_keep_open=True)) as (
                transport, client, server):
            server.transport.close()
            await asyncio.wait_for(client.eof, TIMEOUT)
            transport.write(b"anyone there?")  # TCP takes it; the friend resets
            transport.write(b"no")
            lost = await asyncio.wait_for(client.lost, TIMEOUT)
            assert isinstance(lost, (BrokenPipeError, ConnectionResetError))
    stream = only_stream(path)
    check_tcp_shape(stream, closed_by_fins=False)
    assert stream.up.data == b"anyone there?"
    assert stream.events[-2:] == [("client", "PA"), ("server", "RA")]
    tshark_check(path, {0: (b"anyone there?", b"")})


async def test_several_links_on_two_threads_are_each_whole(tmp_path, other):
    """Clients here, their server on another loop's thread, all echoing at
    once: one file, each stream whole and consistent."""
    rng = random.Random(8)
    payloads = [rng.randbytes(rng.randint(1, 2 * MiB)) for _ in range(4)]
    path = str(tmp_path / "threads.pcap")
    factory = Factory(EchoUntilEof)
    with friendsock.capture(path) as running:
        server = await make_server(other, factory)
        try:
            connections = [await friendsock.create_connection(ThreadRecorder, "127.0.0.1", port_of(server))
                           for _ in payloads]
            for (transport, _), payload in zip(connections, payloads):
                for chunk in chunked(payload, rng, largest=128 * 1024):
                    transport.write(chunk)
                transport.write_eof()
            for transport, client in connections:
                assert await asyncio.wait_for(client.lost, TIMEOUT) is None
        finally:
            await close_server(other, server)
    assert running.links == len(payloads)
    streams = read_capture(path)
    assert len(streams) == len(payloads)
    for (transport, client), payload in zip(connections, payloads):
        assert client.data == payload
        stream = stream_of(streams, transport)
        check_tcp_shape(stream)
        assert stream.up.data == payload and stream.down.data == payload
    # tshark numbers the streams in the order their handshakes appear.
    tshark_check(path, {i: (bytes(s.up.data), bytes(s.down.data)) for i, s in enumerate(streams.values())})


async def test_fallback_connections_are_not_in_the_capture(tmp_path):
    """Real TCP is tcpdump's to see: the capture holds friend links only."""
    path = str(tmp_path / "tcp.pcap")
    with friendsock.capture(path) as running:
        async with connected_pair(False) as (transport, client, server):
            transport.write(b"over the kernel")
            await asyncio.wait_for(server.wait_bytes(15), TIMEOUT)
    assert running.links == 0 and running.packets == 0
    assert read_capture(path) == {}


async def test_only_links_made_while_capturing_are_written(tmp_path):
    path = str(tmp_path / "window.pcap")
    async with connected_pair(True) as (before, _, before_server):
        assert type(before._end.link.client.outgoing) is Channel  # untouched: no cost
        with friendsock.capture(path):
            async with connected_pair(True) as (during, _, server):
                assert type(during._end.link.client.outgoing) is not Channel
                assert [link.captured for link in friendsock.links()] == [False, True]
                before.write(b"not captured")
                during.write(b"captured")
                await asyncio.wait_for(server.wait_bytes(8), TIMEOUT)
                await asyncio.wait_for(before_server.wait_bytes(12), TIMEOUT)
                # Readable while written: the records are in the file already.
                stream = only_stream(path)
                assert stream.handshake and stream.up.data == b"captured"
    stream = only_stream(path)
    check_tcp_shape(stream, closed_by_fins=False)
    assert stream.up.data == b"captured" and stream.down.data == b""


async def test_a_link_that_outlives_the_capture_stops_being_written(tmp_path):
    path = str(tmp_path / "outlive.pcap")
    async with connected_pair(True) as (transport, client, server):
        pass  # made and gone before the capture
    running = friendsock.start_capture(path)
    try:
        async with connected_pair(True) as (transport, client, server):
            transport.write(b"one")
            await asyncio.wait_for(server.wait_bytes(3), TIMEOUT)
            assert friendsock.stop_capture() is running and running.closed
            size = os.path.getsize(path)
            transport.write(b"two")
            await asyncio.wait_for(server.wait_bytes(6), TIMEOUT)
    finally:
        friendsock.stop_capture()
    assert os.path.getsize(path) == size
    assert only_stream(path).up.data == b"one"


async def test_rotation_cuts_files_at_the_size_limit(tmp_path):
    path = str(tmp_path / "ring.pcap")
    payload = random.Random(9).randbytes(MiB)
    limit = 64 * 1024
    with friendsock.capture(path, max_bytes=limit) as running:
        async with connected_pair(True, server_protocol=lambda: Recorder(eof_keep_open=True)) as (
                transport, client, server):
            for chunk in chunked(payload, random.Random(10), largest=8 * 1024):
                transport.write(chunk)
            transport.write_eof()
            await asyncio.wait_for(server.eof, TIMEOUT)
    assert len(running.paths) > 16
    assert running.paths[:3] == [path, str(tmp_path / "ring.1.pcap"), str(tmp_path / "ring.2.pcap")]
    for name in running.paths:
        assert os.path.getsize(name) <= limit
        with open(name, "rb") as f:
            assert f.read(24) == _pcap.FILE_HEADER
    stream = only_stream_of(read_capture(*running.paths))
    assert stream.up.data == payload


def only_stream_of(streams) -> Stream:
    assert len(streams) == 1
    return next(iter(streams.values()))


async def test_rotation_keeps_the_newest_files(tmp_path):
    path = str(tmp_path / "keep.pcap")
    with friendsock.capture(path, max_bytes=16 * 1024, max_files=3) as running:
        async with connected_pair(True) as (transport, client, server):
            for _ in range(40):
                transport.write(b"x" * 4000)
            await asyncio.wait_for(server.wait_bytes(160_000), TIMEOUT)
    assert len(running.paths) == 3
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in running.paths)
    assert running.paths[-1].endswith(f"keep.{running._index}.pcap")


async def test_a_failing_write_stops_the_capture_not_the_connection(tmp_path, caplog):
    path = str(tmp_path / "full.pcap")
    with friendsock.capture(path) as running:
        def disk_full(records):
            raise OSError(28, "No space left on device")

        running._write_all = disk_full
        with caplog.at_level(logging.WARNING, logger="friendsock"):
            async with connected_pair(True) as (transport, client, server):
                transport.write(b"still delivered")
                assert await asyncio.wait_for(server.wait_bytes(15), TIMEOUT) == b"still delivered"
    assert running.closed and running.error is not None and running.error.errno == 28
    assert "capture" in caplog.text and "No space left on device" in caplog.text


# -- starting and stopping ------------------------------------------------------------


def test_a_bad_path_fails_at_start_with_the_path_in_the_error(tmp_path):
    bad = str(tmp_path / "no such dir" / "x.pcap")
    with pytest.raises(OSError, match="no such dir") as info:
        friendsock.start_capture(bad)
    assert info.value.filename == bad
    with pytest.raises(OSError):
        with friendsock.capture(str(tmp_path)):  # a directory
            pass
    assert friendsock.stop_capture() is None  # nothing runs


def test_one_capture_at_a_time(tmp_path):
    with friendsock.capture(str(tmp_path / "a.pcap")):
        with pytest.raises(RuntimeError, match="already running"):
            friendsock.start_capture(str(tmp_path / "b.pcap"))
    with pytest.raises(ValueError):
        friendsock.start_capture(str(tmp_path / "c.pcap"), max_bytes=10)
    assert friendsock.stop_capture() is None


_PROGRAM = textwrap.dedent("""
    import asyncio, friendsock

    async def main():
        async def echo(reader, writer):
            writer.write(await reader.read(100))
            writer.close()
        server = await friendsock.start_server(echo, "127.0.0.1", 0)
        reader, writer = await friendsock.open_connection(*server.sockets[0].getsockname())
        writer.write(b"from the environment")
        assert await reader.read() == b"from the environment"
        writer.close()
        await writer.wait_closed()
        server.close()

    asyncio.run(main())
""")


def run_python(env: Dict[str, str], program: str = _PROGRAM) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", program], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)


def test_environment_captures_from_import_to_exit(tmp_path):
    path = str(tmp_path / "env-{pid}.pcap")
    done = run_python({"FRIENDSOCK_PCAP": path})
    assert done.returncode == 0, done.stderr
    (name,) = os.listdir(tmp_path)
    assert name.startswith("env-") and name[4:-5].isdigit()
    stream = only_stream(str(tmp_path / name))
    check_tcp_shape(stream)
    assert stream.up.data == stream.down.data == b"from the environment"


def test_environment_errors_are_clear_at_start(tmp_path):
    bad = str(tmp_path / "missing" / "x.pcap")
    done = run_python({"FRIENDSOCK_PCAP": bad}, "import friendsock")
    assert done.returncode != 0
    assert "FRIENDSOCK_PCAP" in done.stderr and bad in done.stderr
    done = run_python({"FRIENDSOCK_PCAP": str(tmp_path / "x.pcap"), "FRIENDSOCK_PCAP_MAX": "lots"},
                      "import friendsock")
    assert done.returncode != 0 and "FRIENDSOCK_PCAP_MAX" in done.stderr
    done = run_python({"FRIENDSOCK_PCAP": str(tmp_path / "y.pcap"), "FRIENDSOCK_PCAP_MAX": "1M",
                       "FRIENDSOCK_PCAP_FILES": "2"})
    assert done.returncode == 0, done.stderr
    assert only_stream(str(tmp_path / "y.pcap")).up.data == b"from the environment"


# -- trio links ------------------------------------------------------------------------


@pytest.mark.trio
async def test_trio_links_are_captured(tmp_path):
    rng = random.Random(11)
    up, down = rng.randbytes(3 * MiB + 7), rng.randbytes(100_000)
    path = str(tmp_path / "trio.pcap")
    with friendsock.capture(path):
        async with stream_pair(True) as (client, server):
            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    async def send_up():
                        for chunk in chunked(up, random.Random(12), largest=200_000):
                            await client.send_all(chunk)
                        await client.send_eof()

                    nursery.start_soon(send_up)
                    assert await receive_until_eof(server) == up
                    await server.send_all(down)
                    await server.aclose()
                    assert await receive_until_eof(client) == down
            address = client.getsockname()[:2]
    streams = read_capture(path)
    stream = only_stream_of(streams)
    assert stream.client == tuple(address)
    check_tcp_shape(stream)
    assert stream.up.data == up and stream.down.data == down
    tshark_check(path, {0: (up, down)})


# -- the core on its own: a locked link written from two threads -------------------------


def test_tapped_channels_keep_the_channel_kinds_contract():
    from friendsock._core._tap import TappedChannel, TappedLockedChannel

    assert issubclass(TappedChannel, Channel) and not issubclass(TappedChannel, LockedChannel)
    assert issubclass(TappedLockedChannel, LockedChannel)


def test_short_writes_go_on_where_they_stopped(tmp_path, monkeypatch):
    flow = _pcap.TcpFlow(("127.0.0.1", 1), ("127.0.0.1", 2), 1, 2)
    records = flow.handshake(0) + flow.data(_pcap.CLIENT, random.Random(13).randbytes(200_000), 0)
    real_writev = os.writev

    def short_writev(fd, buffers):  # at most 1000 bytes a call, as a busy disk may
        return real_writev(fd, [bytes(b"".join(bytes(b) for b in buffers)[:1000])])

    running = friendsock.start_capture(str(tmp_path / "short.pcap"))
    try:
        monkeypatch.setattr(os, "writev", short_writev)
        with running.lock:
            running.write(records)
        monkeypatch.undo()
    finally:
        friendsock.stop_capture()
    expected = _pcap.FILE_HEADER + b"".join(bytes(r) for r in records)
    assert (tmp_path / "short.pcap").read_bytes() == expected
    assert running.packets == 3 + 4 * 2 and running.bytes == len(expected)  # 4 segments, 4 ACKs
