"""asyncio streams across two threads, the client's loop in the test's
thread and the server's in another, answer over a friend link as over
TCP: the calls, the driver and the comparison of
tests/test_streams_parity.py, the server's side driven on its own loop (a
link between threads goes through other code: locked channels, wake-ups
handed to the other loop).
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import friendsock
from parity_states import THREADS, states_of
from support import LOOP_RUNNERS, answers_that_differ, report, until
from test_streams_parity import WAIT, Streams, _calls, answer_each, driver_on
from test_threads import TIMEOUT, LoopThread


async def _connection(friends: bool, thread: LoopThread) -> Tuple[Streams, Streams, asyncio.AbstractServer]:
    accepted: List[Streams] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append((reader, writer))

    server = await thread.run(friendsock.start_server(handler, "127.0.0.1", 0, friends=friends))
    port = server.sockets[0].getsockname()[1]
    client = await asyncio.wait_for(friendsock.open_connection("127.0.0.1", port), TIMEOUT)
    assert friendsock.is_friend(client[1].transport) is friends
    await until(lambda: bool(accepted))
    if friends:  # a link between two threads' loops
        sockname = client[1].get_extra_info("sockname")
        assert [link.threaded for link in friendsock.links() if link.client.address == sockname] == [True]
    return client, accepted[0], server


async def _answers(friends: bool, state: str, thread: LoopThread, names: Optional[List[str]] = None,
                   wait: float = WAIT) -> Dict[str, Any]:
    names = list(names or _calls(None, None))  # type: ignore[arg-type]
    opened: List[Tuple[Streams, Streams, asyncio.AbstractServer]] = []
    try:
        for _ in names:
            opened.append(await _connection(friends, thread))
        return await answer_each(names, [(client, served) for client, served, _ in opened],
                                 driver_on(thread, THREADS)[state], wait)
    finally:
        for client, served, server in opened:
            client[1].transport.abort()
            await thread.call(served[1].transport.abort)
            await thread.call(server.close)


@pytest.fixture
def server_thread(loop_kind: str) -> Iterator[LoopThread]:
    """The server's loop, of the test's kind, in a thread of its own; must
    see no loop errors."""
    thread = LoopThread(loop_kind)
    try:
        yield thread
    finally:
        thread.close()
    assert thread.errors == []


@pytest.mark.parametrize("state", states_of(THREADS))
@pytest.mark.parametrize("loop_kind", list(LOOP_RUNNERS))
def test_every_call_answers_as_over_tcp(loop_kind, server_thread, state):
    run = LOOP_RUNNERS[loop_kind]

    def answers(paired: bool, names: Optional[List[str]] = None, wait: float = WAIT) -> Dict[str, Any]:
        return run(_answers(paired, state, server_thread, names, wait))

    differing = answers_that_differ(answers(False), answers(True),
                                    lambda name, paired: answers(paired, [name], 1.0)[name])
    assert not differing, report(differing)
