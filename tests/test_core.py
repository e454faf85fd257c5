"""The sans-IO core on its own: accounting, channel states, the registry."""

from __future__ import annotations

import errno
import gc
import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from friendsock._core import _fork
from friendsock._core._addresses import flow_key, normalize_endpoint
from friendsock._core._errors import ChannelShutdownError, LinkBrokenError, PeerResetError
from friendsock._core._finalizing import close_when_safe
from friendsock._core._channel import Channel, ChannelState, Seen
from friendsock._core._link import Link
from friendsock._core._registry import ListenerEntry, PendingConnect, PendingState, Registry
from friendsock._core._stats import Fallback, counters


def test_flow_key_is_direction_independent_and_folds_mapped_ipv4():
    a = ("127.0.0.1", 40000)
    b = ("::ffff:127.0.0.1", 8080, 0, 0)
    assert flow_key(a, b) == flow_key(b, a)
    assert normalize_endpoint(b) == ("127.0.0.1", 8080)
    assert normalize_endpoint(("fe80::1%eth0", 1, 0, 2)) == ("fe80::1", 1)


def test_accounting_counts_capacity_as_sndbuf_plus_friend_rcvbuf():
    channel = Channel(sndbuf=100, rcvbuf=50)
    channel.push(b"x" * 150)
    assert channel.write_buffer_size() == 0
    channel.push(b"y")
    assert channel.queued == 151
    assert channel.write_buffer_size() == 1
    channel.rcvbuf = 51
    assert channel.write_buffer_size() == 0


def test_one_reader_notification_per_burst():
    channel = Channel(sndbuf=10, rcvbuf=10)
    wakes = []
    channel.notify_readable = lambda: wakes.append(1)
    for _ in range(5):
        channel.push(b"abc")
    assert wakes == [1]
    assert channel.pull(1 << 20) == b"abc" * 5
    channel.begin_drain()
    channel.push(b"d")
    assert wakes == [1, 1]


def test_pull_hands_a_single_buffer_over_by_reference():
    channel = Channel(sndbuf=10, rcvbuf=10)
    data = b"z" * 1000
    channel.push(data)
    assert channel.pull(1000) is data


def test_pull_cuts_a_buffer_larger_than_the_limit():
    # A TCP read returns at most what it asked for; readers' flow control
    # (a StreamReader pausing at its limit) relies on it.
    channel = Channel(sndbuf=10, rcvbuf=10)
    data = bytes(range(250)) * 4
    channel.push(data)
    channel.push(b"tail")
    assert channel.pull(300) == data[:300]
    assert channel.pull(300) == data[300:600]
    assert channel.queued == 404
    assert channel.pull(1000) == data[600:] + b"tail"
    assert channel.queued == 0


def test_pull_respects_the_limit_between_buffers():
    channel = Channel(sndbuf=10, rcvbuf=10)
    for chunk in (b"aa", b"bb", b"cc"):
        channel.push(chunk)
    assert channel.pull(4) == b"aabb"
    assert channel.pull(4) == b"cc"
    assert channel.queued == 0


def test_writer_is_woken_when_its_buffer_falls_to_the_threshold():
    channel = Channel(sndbuf=10, rcvbuf=10)
    wakes = []
    channel.notify_writable = lambda: wakes.append(channel.write_buffer_size())
    channel.push(b"x" * 40)  # 20 over capacity
    assert channel.wake_writer_at(5) is False
    assert channel.pull_into(memoryview(bytearray(10))) == 10
    assert wakes == []
    channel.pull_into(memoryview(bytearray(5)))
    assert wakes == [5]
    assert channel.wake_writer_at(5) is True


def test_a_setsockopt_that_grows_capacity_wakes_the_writer():
    channel = Channel(sndbuf=10, rcvbuf=10)
    wakes = []
    channel.notify_writable = lambda: wakes.append(1)
    channel.push(b"x" * 30)
    channel.wake_writer_at(0)
    channel.rcvbuf = 20
    channel.capacity_changed()
    assert wakes == [1]


def test_write_after_shutdown_and_to_a_closed_reader_raise_core_errors():
    channel = Channel(sndbuf=10, rcvbuf=10)
    channel.shutdown()
    with pytest.raises(ChannelShutdownError):
        channel.push(b"x")
    wakes = []
    channel.notify_readable = lambda: wakes.append(1)
    assert channel.shutdown() is True  # EOF twice is one EOF (shutdown() twice, as TCP's)
    assert channel.state is ChannelState.EOF and wakes == []
    other = Channel(sndbuf=10, rcvbuf=10)
    other.push(b"abc")
    assert other.close_reader() is True
    assert other.queued == 0
    with pytest.raises(PeerResetError):
        other.push(b"x")


def test_truncate_and_reset_keep_a_prefix():
    channel = Channel(sndbuf=4, rcvbuf=3)
    for chunk in (b"abc", b"def", b"ghi"):
        channel.push(chunk)
    channel.truncate(channel.capacity)
    assert channel.queued == 7
    channel.reset(keep=5)
    assert channel.state is ChannelState.RESET
    out = bytearray(100)
    n = channel.pull_into(memoryview(out))
    assert bytes(out[:n]) == b"abcde"


def test_close_with_unread_bytes_resets_the_friend_and_keeps_its_rcvbuf():
    link = Link(client_sndbuf=8, client_rcvbuf=4, server_sndbuf=8, server_rcvbuf=4)
    link.establish()
    link.server.outgoing.push(b"0123456789")  # server -> client, unread
    link.client.outgoing.push(b"abcdefghij")  # client -> server
    link.client.close()  # the client had unread bytes: RST
    to_server = link.server.incoming
    assert to_server.state is ChannelState.RESET
    assert to_server.pull(100) == b"abcd"  # what sat in the server's rcvbuf
    assert link.server.outgoing.reader_closed


def test_close_without_unread_bytes_sends_eof_after_the_data():
    link = Link(8, 8, 8, 8)
    link.client.outgoing.push(b"x" * 100)
    link.client.close()
    channel = link.server.incoming
    assert channel.state is ChannelState.EOF
    assert channel.pull(1000) == b"x" * 100


def test_going_on_over_tcp_takes_an_end_closed_with_eof_and_refuses_a_reset():
    """Going on over TCP: each end's queued bytes and EOF go to its socket,
    a closed end's too; a direction reset (a close over unread bytes)
    cannot be carried over."""
    link = Link(100, 100, 100, 100, threaded=True)
    link.establish()
    link.client.outgoing.push(b"request")
    link.client.close()
    sent = []
    assert link.go_on_over_tcp(lambda end, data, eof: sent.append((end, data, eof)), limit=1000)
    assert sent == [(link.client, b"request", True), (link.server, b"", False)]
    assert link.server.incoming.state is ChannelState.TCP
    assert link.server.outgoing.state is ChannelState.TCP

    reset = Link(100, 100, 100, 100, threaded=True)
    reset.establish()
    reset.server.outgoing.push(b"unread by the client")
    reset.client.close()
    assert not reset.go_on_over_tcp(lambda *args: sent.append(args), limit=1000)
    assert len(sent) == 2


class _LockWatched:
    """A channel's lock that sets ``tried`` when a thread asks for it."""

    def __init__(self, lock: threading.Lock, tried: threading.Event) -> None:
        self._lock = lock
        self.tried = tried

    def acquire(self, *args: object) -> bool:
        self.tried.set()
        return self._lock.acquire(*args)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


@pytest.mark.parametrize("call, answer", [
    (lambda end: end.send_some(b"written after"), -1),
    (lambda end: end.shutdown_write(), False),
])
def test_a_write_racing_the_move_to_tcp_goes_to_the_socket_after_what_was_queued(call, answer):
    """A write or shutdown on another thread while the link goes on over
    TCP: it is told to use its socket (-1, False) only once the hand-over
    has put the queued bytes there, so nothing overtakes them, and the
    shutdown neither raises nor is lost."""
    link = Link(100, 100, 100, 100, threaded=True)
    link.establish()
    link.client.outgoing.push(b"queued before")
    order = []
    answers = []
    moved_on = threading.Event()  # the writer asked for the lock, or is done
    done = threading.Event()

    def write() -> None:
        answers.append(call(link.client))
        order.append("the writer's own")
        moved_on.set()
        done.set()

    def send(end, data, eof) -> None:
        if end is link.client:
            channel = end.outgoing
            channel._lock = _LockWatched(channel._lock, moved_on)
            threading.Thread(target=write).start()
            assert moved_on.wait(10)
            order.append(data)

    assert link.go_on_over_tcp(send, limit=1000)
    assert done.wait(10)
    assert order == [b"queued before", "the writer's own"]
    assert answers == [answer]
    assert link.client.shutdown_write() is False  # and once over TCP, every time


def test_abort_keeps_what_fits_in_sndbuf_plus_friend_rcvbuf():
    link = Link(client_sndbuf=10, client_rcvbuf=10, server_sndbuf=10, server_rcvbuf=5)
    link.client.outgoing.push(b"y" * 100)
    link.client.abort()
    assert link.server.incoming.queued == 15
    assert link.server.incoming.state is ChannelState.EOF


def test_what_a_reader_sees_data_then_eof_or_the_reset():
    link = Link(100, 100, 100, 100)
    channel = link.server.incoming
    assert channel.seen() is Seen.NOTHING
    link.client.outgoing.push(b"abc")
    link.client.shutdown_write()
    assert channel.seen() is Seen.DATA  # the bytes before the EOF
    channel.pull(10)
    assert channel.seen() is Seen.EOF
    other = Link(100, 100, 100, 100)
    other.client.outgoing.push(b"abc")
    other.client.outgoing.reset(keep=1)
    reader = other.server.incoming
    assert reader.seen() is Seen.DATA and reader.pull(10) == b"a"
    assert reader.seen() is Seen.RESET


def test_a_friend_that_closed_cleanly_takes_one_send_then_it_fails_with_epipe():
    link = Link(100, 100, 100, 100)
    link.server.close()  # nothing unread: a FIN
    with pytest.raises(PeerResetError):
        link.client.outgoing.push(b"x")
    link.client.send_refused()  # TCP takes it; the friend's kernel resets
    assert link.client.incoming.state is ChannelState.RESET
    assert link.client.incoming.seen() is Seen.EOF  # the FIN came first
    with pytest.raises(LinkBrokenError) as raised:
        link.client.send_refused()
    assert raised.value.errno == errno.EPIPE
    assert isinstance(raised.value.as_os_error(), BrokenPipeError)
    with pytest.raises(LinkBrokenError) as raised:
        link.client.shutdown_write()
    assert raised.value.errno == errno.ENOTCONN


def test_a_friend_that_closed_with_bytes_unread_resets_reads_and_sends():
    link = Link(100, 100, 100, 100)
    link.client.outgoing.push(b"unread")
    link.server.close()  # unread bytes: a reset, no FIN
    assert link.client.incoming.seen() is Seen.RESET
    with pytest.raises(PeerResetError):
        link.client.outgoing.push(b"x")
    with pytest.raises(LinkBrokenError) as raised:
        link.client.send_refused()
    assert isinstance(raised.value.as_os_error(), ConnectionResetError)


@pytest.mark.parametrize("first", ["read", "send", "empty send"])
def test_a_reset_is_reported_once_then_eof_and_epipe(first):
    """The kernel leaves the reset's error pending and clears it as the
    first call reports it: after that a read finds EOF, a send EPIPE."""
    link = Link(100, 100, 100, 100)
    link.client.outgoing.push(b"unread")
    link.server.close()
    end = link.client
    if first == "read":
        error = end.take_error()
    else:
        with pytest.raises(LinkBrokenError) as raised:
            end.send_some(b"x" if first == "send" else b"")
        error = raised.value
    assert error is not None and error.errno == errno.ECONNRESET
    assert end.take_error() is None  # a read: EOF
    for data in (b"x", b""):
        with pytest.raises(LinkBrokenError) as raised:
            end.send_some(data)
        assert raised.value.errno == errno.EPIPE


def test_a_reset_after_the_fin_is_pending_as_epipe():
    """tcp_reset() in CLOSE_WAIT: the pending error is EPIPE, and reads go
    on to the bytes and EOF."""
    link = Link(100, 100, 100, 100)
    link.server.outgoing.push(b"last")
    link.server.shutdown_write()
    link.client.outgoing.push(b"unread")
    link.server.close()
    end = link.client
    assert end.incoming.seen() is Seen.DATA
    error = end.take_error()
    assert error is not None and error.errno == errno.EPIPE
    assert end.take_error() is None


def test_an_empty_send_is_checked_and_sends_nothing():
    link = Link(100, 100, 100, 100)
    assert link.client.send_some(b"") == 0
    assert link.client.outgoing.queued == 0
    link.client.shutdown_write()
    with pytest.raises(LinkBrokenError) as raised:
        link.client.send_some(b"")
    assert raised.value.errno == errno.EPIPE


def test_a_friend_closing_with_a_backlog_unread_fails_only_the_pending_send():
    link = Link(10, 100, 100, 10)  # client capacity: 10 + 10
    link.client.outgoing.push(b"x" * 15)
    link.server.close()
    assert link.client.pending_send_error() is None  # all of it fitted
    busy = Link(10, 100, 100, 10)
    busy.client.outgoing.push(b"x" * 25)  # 5 bytes in the client's own buffer
    busy.server.close()
    error = busy.client.pending_send_error()
    assert error is not None and error.errno == errno.ECONNRESET


def test_link_counts_alive_and_calls_done_once_both_ends_close():
    made, alive = counters.links_made, counters.links_alive
    link = Link(8, 8, 8, 8)
    done = []
    link.on_done = lambda: done.append(1)
    link.establish()
    link.establish()
    assert (counters.links_made, counters.links_alive) == (made + 1, alive + 1)
    link.client.close()
    assert done == [] and not link.done
    link.server.close()
    assert done == [1] and link.done
    assert counters.links_alive == alive


@settings(max_examples=200, deadline=None)
@given(
    writes=st.lists(st.binary(min_size=1, max_size=300), max_size=30),
    reads=st.lists(st.tuples(st.booleans(), st.integers(1, 500)), max_size=60),
)
def test_bytes_come_out_in_order_whatever_the_read_pattern(writes, reads):
    channel = Channel(sndbuf=64, rcvbuf=64)
    for data in writes:
        channel.push(data)
    received = bytearray()
    for into, size in reads:
        if not channel.queued:
            break
        if into:
            buffer = bytearray(size)
            received += buffer[: channel.pull_into(memoryview(buffer))]
        else:
            received += channel.pull(size)
        assert channel.queued == sum(map(len, writes)) - len(received)
    expected = b"".join(writes)
    assert bytes(received) == expected[: len(received)]


def _entry(address, **kw):
    kw.setdefault("v6only", False)
    kw.setdefault("exclusive", True)
    return ListenerEntry(address, owner=object(), handle=None, **kw)


def test_registry_matches_exact_then_wildcard_listeners():
    registry = Registry()
    any4 = _entry(("0.0.0.0", 9000))
    v6only = _entry(("::", 9001), v6only=True)
    dual = _entry(("::", 9002))
    for entry in (any4, v6only, dual):
        registry.add_listener(entry)
    assert registry.has_port(9000) and not registry.has_port(9003)
    assert registry.match_listener(("127.0.0.1", 9000)) == (any4, True)
    assert registry.match_listener(("::1", 9000)) == (None, False)
    assert registry.match_listener(("127.0.0.1", 9001)) == (None, False)
    assert registry.match_listener(("::1", 9001, 0, 0)) == (v6only, True)
    assert registry.match_listener(("127.0.0.1", 9002)) == (dual, True)


def test_registry_reports_a_shared_port_as_not_the_only_listener():
    registry = Registry()
    first, second = _entry(("127.0.0.1", 9000)), _entry(("127.0.0.1", 9000))
    registry.add_listener(first)
    registry.add_listener(second)
    assert registry.match_listener(("127.0.0.1", 9000)) == (first, False)


def test_claim_and_withdraw_are_exclusive():
    registry = Registry()
    entry = _entry(("127.0.0.1", 9000))
    registry.add_listener(entry)
    key = flow_key(("127.0.0.1", 5000), ("127.0.0.1", 9000))
    pending = PendingConnect(key, Link(8, 8, 8, 8), entry)
    registry.add_pending(pending)
    assert registry.claim(key) is pending
    assert pending.state is PendingState.CLAIMED
    assert registry.withdraw(pending) is False
    assert registry.claim(key) is None

    late = PendingConnect(key, Link(8, 8, 8, 8), entry)
    registry.add_pending(late)
    assert registry.withdraw(late) is True
    assert registry.claim(key) is None
    assert registry.pending_count() == 0


def test_removing_a_listener_hands_back_its_waiting_connects():
    registry = Registry()
    entry, other = _entry(("127.0.0.1", 9000)), _entry(("127.0.0.1", 9001))
    registry.add_listener(entry)
    registry.add_listener(other)
    mine = PendingConnect(flow_key(("127.0.0.1", 1), ("127.0.0.1", 9000)), Link(8, 8, 8, 8), entry)
    theirs = PendingConnect(flow_key(("127.0.0.1", 2), ("127.0.0.1", 9001)), Link(8, 8, 8, 8), other)
    registry.add_pending(mine)
    registry.add_pending(theirs)
    assert registry.remove_listener(entry) == [mine]
    assert mine.state is PendingState.WITHDRAWN
    assert registry.pending_count() == 1
    assert not registry.has_port(9000)
    assert registry.remove_listener(entry) == []


def test_a_forked_child_starts_with_an_empty_registry():
    from friendsock._core._registry import registry

    entry = _entry(("127.0.0.1", 9100))
    registry.add_listener(entry)
    try:
        pid = os.fork()
        if pid == 0:  # the child: nothing inherited may pair
            os._exit(0 if registry.listener_count() == 0 and not registry.has_port(9100) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert registry.has_port(9100)
    finally:
        registry.remove_listener(entry)


class _Finalized:
    """Records the thread its finalizer's close ran on."""

    def __init__(self, done: "threading.Event", ran_on: list) -> None:
        self.done, self.ran_on = done, ran_on

    def __del__(self) -> None:
        done, ran_on = self.done, self.ran_on

        def close() -> None:
            ran_on.append(threading.get_ident())
            done.set()

        close_when_safe(close)


def test_a_finalizers_close_runs_at_once_unless_a_collection_runs_it():
    """Dropped by its last reference, an end closes on the spot; found by a
    collection (which may have started inside a lock the close takes), on
    a thread of its own, soon."""
    done, ran_on = threading.Event(), []
    _Finalized(done, ran_on)
    assert done.is_set() and ran_on == [threading.get_ident()]

    done, ran_on = threading.Event(), []
    cyclic = _Finalized(done, ran_on)
    cyclic.cycle = cyclic
    del cyclic
    gc.collect()
    assert done.wait(10)
    assert len(ran_on) == 1 and ran_on[0] != threading.get_ident()


_FORK_ORDER_PROGRAM = r'''
import os, sys
registered = []
real = os.register_at_fork
def spy(**hooks):
    registered.append(sorted({h.__module__ for h in hooks.values()}))
    real(**hooks)
os.register_at_fork = spy
import friendsock, friendsock.trio, friendsock._blocking._patch, friendsock._capture
from friendsock._core import _fork
print([mods for mods in registered if any(m.startswith("friendsock") for m in mods)])
print([part.name for part in sorted(_fork._hooks)])
seen = []
for part in _fork.Part:
    _fork.on_fork(part, before=lambda p=part: seen.append(("before", p.name)),
                  after_in_parent=lambda p=part: seen.append(("parent", p.name)),
                  after_in_child=lambda p=part: seen.append(("child", p.name)))
def fails():
    seen.append(("child", "STATS"))
    1 / 0
_fork.on_fork(_fork.Part.STATS, before=lambda: seen.append(("before", "STATS")),
              after_in_parent=lambda: seen.append(("parent", "STATS")), after_in_child=fails)
pid = os.fork()
if pid == 0:
    print([p for w, p in seen if w == "before"], [p for w, p in seen if w == "child"], flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print([p for w, p in seen if w == "parent"])
'''


def test_a_fork_runs_every_part_from_one_registration_in_order() -> None:
    done = subprocess.run([sys.executable, "-c", _FORK_ORDER_PROGRAM], capture_output=True,
                          text=True, timeout=60, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "[['friendsock._core._fork']]"  # friendsock registers once
    order = [part.name for part in _fork.Part]
    assert lines[1] == str(order)  # every part has its hooks
    child_before, child_after = lines[2].split("] [")
    assert child_before + "]" == str(order[::-1])  # before: in reverse
    # After: in order; the failing one reported, the others run.
    assert "[" + child_after == str(order)
    assert lines[3] == str(order)
    assert "ZeroDivisionError" in done.stderr and "STATS" in done.stderr


def test_since_counts_an_address_counted_afresh_from_zero() -> None:
    """An address whose counts were dropped for newer ones and begun
    again shows all it has now, even when that equals what it had."""
    from friendsock._core._stats import MAX_PLACES, Counters
    from friendsock._report import since

    stats = Counters()
    listener = ("127.0.0.1", 8000)
    stats.link_made(listener)
    before = stats.snapshot(pending=0)
    for number in range(MAX_PLACES * 2):  # every other address is used since: 8000's go
        stats.link_made(("127.0.0.2", 10000 + number))
    stats.link_made(listener)
    middle = stats.snapshot(pending=0)
    delta = since(before, middle)
    assert delta.links_made == MAX_PLACES * 2 + 1
    assert delta.listeners["127.0.0.1:8000"].links_made == 1
    # An address counted all along shows its difference.
    stats.link_made(listener)
    assert since(middle, stats.snapshot(pending=0)).listeners["127.0.0.1:8000"].links_made == 1


def test_since_counts_what_other_threads_kept_at_an_address_counted_afresh() -> None:
    """An address whose counts this thread dropped and began again, while
    another thread kept its own there: only what came since shows."""
    import threading

    from friendsock._core._stats import MAX_PLACES, Counters
    from friendsock._report import since

    stats = Counters()
    listener = ("127.0.0.1", 8000)
    other = threading.Thread(target=stats.fallback, args=(Fallback.PEER_NOT_FRIEND, listener))
    other.start()
    other.join(timeout=30)
    stats.link_made(listener)
    before = stats.snapshot(pending=0)
    for number in range(MAX_PLACES * 2):  # this thread's counts at 8000 go
        stats.link_made(("127.0.0.2", 10000 + number))
    stats.link_made(listener)
    stats.fallback(Fallback.OPTED_OUT, listener)
    after = stats.snapshot(pending=0)
    assert after.listeners["127.0.0.1:8000"].fallbacks == {"peer-not-friend": 1, "opted-out": 1}
    delta = since(before, after).listeners["127.0.0.1:8000"]
    assert delta.links_made == 1 and delta.fallbacks == {"opted-out": 1}


def test_moves_between_processes_are_counted_per_process() -> None:
    """Per other process, the most first; past MAX_PEERS processes those
    counted least go, the totals keep every one; since(), the report's
    JSON and the text report carry the counts."""
    from friendsock._core._stats import MAX_PEERS, Counters
    from friendsock._report import as_dict, combined, from_dict, since, text_lines

    stats = Counters()
    for _ in range(3):
        stats.moved_across(4242)
    stats.moved_across(4343)
    before = stats.snapshot(pending=0)
    assert dict(before.cross_process_peers) == {4242: 3, 4343: 1}
    assert list(before.cross_process_peers) == [4242, 4343]
    for pid in range(100_000, 100_000 + MAX_PEERS):  # one each: the least counted go first
        stats.moved_across(pid)
    after = stats.snapshot(pending=0)
    assert after.cross_process == 4 + MAX_PEERS
    assert len(after.cross_process_peers) <= MAX_PEERS
    assert after.cross_process_peers[4242] == 3 and 100_000 + MAX_PEERS - 1 in after.cross_process_peers
    delta = since(before, after)
    assert delta.cross_process == MAX_PEERS and 4242 not in delta.cross_process_peers
    assert from_dict(as_dict(after)).cross_process_peers == after.cross_process_peers
    both = combined([before, before])
    assert dict(both.cross_process_peers) == {4242: 6, 4343: 2}
    assert text_lines(both)[1] == "between processes: 8 moved off TCP (pid 4242: 6, pid 4343: 2)"
    many = text_lines(after)[1]
    assert many.startswith(f"between processes: {4 + MAX_PEERS:,} moved off TCP (pid 4242: 3, ")
    assert many.endswith(f", {len(after.cross_process_peers) - 5:,} more)")
