"""Pre-fork servers and process pools, run as their users run them, with
friendsock switched on as the README says (``FRIENDSOCK_INSTALL=1``).

``uvicorn --workers 2`` and gunicorn with uvicorn's workers: the workers
share one listener, and the one that accepts a connection is the process
it moves to. A ``multiprocessing`` pool's workers, forked or spawned,
are blocking clients of a server here. On the TCP path the same runs with
``FRIENDSOCK_CROSS_PROCESS=0`` and nothing moves.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import os
import random
import re
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Set, Tuple

import httpx
import pytest
import pytest_asyncio

import friendsock
from friendsock._handshake._tcp_info import payload_moved
from friendsock._host._ports import listener_elsewhere

from cross_process_peer import pool_echo
from support import bounded, until
from test_cross_process import _environment, no_peer_left, nothing_left_open, socket_patched  # noqa: F401

APP = '''
import hashlib, os

async def app(scope, receive, send):
    """Answers a POST with the pid that served it and its body's SHA-256."""
    if scope["type"] != "http":
        return
    digest = hashlib.sha256()
    while True:
        message = await receive()
        digest.update(message.get("body", b""))
        if not message.get("more_body"):
            break
    answer = f"{os.getpid()} {digest.hexdigest()}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})
'''

WORKERS = 2
SERVERS = {
    # (the command after the interpreter, the line that names its port)
    "uvicorn-asyncio": (["-m", "uvicorn", "app:app", "--workers", str(WORKERS), "--host", "127.0.0.1",
                         "--port", "0", "--loop", "asyncio", "--lifespan", "off"],
                        r"Uvicorn running on http://127\.0\.0\.1:(\d+)"),
    "uvicorn-uvloop": (["-m", "uvicorn", "app:app", "--workers", str(WORKERS), "--host", "127.0.0.1",
                        "--port", "0", "--loop", "uvloop", "--lifespan", "off"],
                       r"Uvicorn running on http://127\.0\.0\.1:(\d+)"),
    "gunicorn-uvicorn-worker": (["-m", "gunicorn", "-k", "uvicorn_worker.UvicornWorker",
                                 "-w", str(WORKERS), "-b", "127.0.0.1:0", "app:app"],
                                r"Listening at: http://127\.0\.0\.1:(\d+)"),
}
STARTED = re.compile(r"Started server process \[(\d+)\]")


async def _prefork_server(kind: str, path: str, directory: Path,
                          ended_after: List[asyncio.subprocess.Process]) -> Tuple[asyncio.subprocess.Process, int]:
    """``kind`` serving APP from ``directory``, and its port, once each
    worker has started and the listener is published (its workers' loops
    serve it); ended after the test (``ended_after``), however it went."""
    (directory / "app.py").write_text(APP)
    args, port_line = SERVERS[kind]
    env = _environment(path, FRIENDSOCK_INSTALL="1", PYTHONPATH=str(directory))
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=directory, env=env, stderr=asyncio.subprocess.PIPE)
    ended_after.append(process)
    assert process.stderr is not None
    port, started = 0, 0
    while not port or started < WORKERS:
        line = (await bounded(process.stderr.readline(), 30)).decode()
        assert line, "the server ended before it served"
        found = re.search(port_line, line)
        if found:
            port = int(found.group(1))
        started += bool(STARTED.search(line))
    if path == "friend":
        await until(lambda: listener_elsewhere(port))
    return process, port  # (what they log from now on is read as they end)


@pytest_asyncio.fixture
async def ended_after() -> AsyncIterator[List[asyncio.subprocess.Process]]:
    """Processes to end (SIGTERM, as their supervisor does) after the test."""
    processes: List[asyncio.subprocess.Process] = []
    yield processes
    for process in processes:
        if process.returncode is None:
            process.terminate()
            try:
                await bounded(process.communicate(), 20)
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()


@pytest.mark.parametrize("kind", list(SERVERS))
async def test_the_worker_that_accepts_is_the_one_that_pairs(kind, path, tmp_path, ended_after):
    """Each connection of an httpx client here (installed, as the README's
    ``install()``) moves to the worker that accepted it: the pid that
    answered is the one ``links()`` names; kept connections carry a second
    request; every body arrives whole."""
    process, port = await _prefork_server(kind, path, tmp_path, ended_after)
    answered: Set[int] = set()
    with friendsock.installed():
        for client_number in range(4):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for request in range(2):
                    body = random.Random(client_number * 10 + request).randbytes(256 * 1024)
                    response = await bounded(client.post("/", content=body), 30)
                    pid_text, digest = response.text.split()
                    pid = int(pid_text)
                    assert digest == hashlib.sha256(body).hexdigest()
                    assert pid != process.pid  # a worker's, not the supervisor's
                    answered.add(pid)
                    peers = [link.peer_pid for link in friendsock.links()
                             if link.peer_pid is not None and link.server.address[1] == port]
                    assert peers == ([pid] if path == "friend" else [])
    assert 1 <= len(answered) <= WORKERS


def _echoed_by_pool(start_method: str, port: int, seeds: List[int]) -> List[Dict[str, Any]]:
    with multiprocessing.get_context(start_method).Pool(2) as pool:
        return pool.starmap(pool_echo, [(port, seed) for seed in seeds], chunksize=1)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_process_pools_workers_move_to_a_server_here(start_method, path, monkeypatch):
    """``multiprocessing.Pool`` workers connect with blocking sockets: a
    forked one inherits ``patch_socket()``, a spawned one is switched on
    by the environment it inherits (``FRIENDSOCK_INSTALL=1`` and
    ``FRIENDSOCK_SOCKETS=1``)."""
    monkeypatch.setenv("FRIENDSOCK_INSTALL", "1")
    monkeypatch.setenv("FRIENDSOCK_SOCKETS", "1")
    if path == "tcp":
        monkeypatch.setenv("FRIENDSOCK_CROSS_PROCESS", "0")
        friendsock.set_cross_process(False)
    served: List[Dict[str, Any]] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        digest = hashlib.sha256()
        while data := await reader.read(1 << 16):
            digest.update(data)
            writer.write(data)
        served.append({"sha256": digest.hexdigest(),
                       "payload_moved": payload_moved(writer.get_extra_info("socket"))})
        writer.close()

    try:
        server = await friendsock.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        before = sum(friendsock.stats().cross_process_peers.values())
        seeds = list(range(4))
        try:
            results = await bounded(asyncio.to_thread(_echoed_by_pool, start_method, port, seeds), 60)
            await until(lambda: len(served) == len(seeds))
        finally:
            server.close()
            await bounded(server.wait_closed())
    finally:
        friendsock.set_cross_process(True)
    sent = [hashlib.sha256(random.Random(seed).randbytes(1 << 20)).hexdigest() for seed in seeds]
    assert [result["sha256"] for result in results] == sent
    assert sorted(entry["sha256"] for entry in served) == sorted(sent)
    assert {result["pid"] for result in results} - {os.getpid()}, "served by the pool's workers"
    moved = path == "friend"
    assert all(result["payload_moved"] is not moved for result in results)
    assert all(entry["payload_moved"] is not moved for entry in served)
    assert sum(friendsock.stats().cross_process_peers.values()) - before == (len(seeds) if moved else 0)
