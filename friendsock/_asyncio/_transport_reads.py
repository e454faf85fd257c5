"""The read side of a friend transport: what its friend wrote, delivered to
the protocol on this end's loop (``data_received()``, or
``get_buffer()``/``buffer_updated()``), then the friend's EOF or reset;
``pause_reading()``/``resume_reading()``.

Delivery is deferred to the reader's loop, one drain per burst, so a reply
never recurses into the writer's stack (see ``_wakeups.DrainQueue``).
"""

from __future__ import annotations

import asyncio

from .._core._channel import CHANNEL_OPEN, SEEN_EOF, SEEN_RESET, Seen
from ._transport_base import TransportBase
from ._wakeups import ASK_AT

# Largest chunk handed to data_received in one call (asyncio's socket read
# size); whole writes up to it go by reference, a larger one is cut.
_MAX_CHUNK = 256 * 1024
# Small writes are joined into one data_received up to this size; larger
# ones go over by reference, uncopied.
_MAX_JOIN = 64 * 1024


class ReadSide(TransportBase):
    """A friend transport's reading: the ``asyncio.ReadTransport`` calls,
    and the drain that delivers."""

    __slots__ = ()

    def _schedule_drain(self) -> None:
        """From this loop's own thread: deliver soon, never now. Not even
        to asyncio's own stream protocol, whose feed runs no user code: fed
        at once, its reader's task would wake before the writer's next step,
        where over TCP the reader learns of the bytes only at the loop's next
        poll (aioftp's server answers, then frees the data port a step
        later, and its tests count on the port being free when the answer
        is read)."""
        # See DrainQueue: for the running drain's rounds, or a callback of its own.
        drains = self._drains
        if drains.running:
            drains.waiting.append((self._drain, self._context))
        else:
            self._loop.call_soon(self._drain, context=self._context)

    # -- ReadTransport ----------------------------------------------------
    def is_reading(self) -> bool:
        return not self._paused_reading and not self._closing

    @property
    def _paused(self) -> bool:
        """The loop's own transports' private flag, which code reaching past
        their API reads (uvloop's own tests among it): asyncio's is set by
        pause_reading() and unset by resume_reading(); uvloop's says the
        transport reads no more."""
        if isinstance(self._loop, asyncio.BaseEventLoop):
            return self._paused_reading
        return not self.is_reading()

    def pause_reading(self) -> None:
        if not self.is_reading():
            return
        self._paused_reading = True

    def resume_reading(self) -> None:
        if self._closing or not self._paused_reading:
            return
        self._paused_reading = False
        self._schedule_drain()

    def _drain(self) -> None:
        """Deliver what is queued now, then EOF or the reset if that is all
        that is left. A push from here on schedules the next drain: a writer
        refilling from resume_writing() (called from this loop) must not
        keep the event loop in one callback forever. The outermost drain
        runs the drains asked for meanwhile as it ends (see DrainQueue)."""
        if self._paused_reading or self._closing or self._eof_delivered:
            # The notification stays taken: no wake-ups while paused
            # (resume_reading() drains), nor after EOF, when asyncio stops
            # reading for good (a later reset is learnt by writing).
            return
        channel = self._in
        drains = self._drains
        outermost = not drains.running
        if outermost:
            if drains.left <= 0:  # the loop's turn has had its share
                drains.defer(self._drain, self._context)
                return
            drains.running = True
        try:
            if self._buffered:
                self._drain_into_buffers()
            else:  # data_received(), the hot path: inline
                try:
                    # The first chunk with the same lock round trip as begin_drain.
                    data, budget = channel.begin_pull(_MAX_CHUNK, _MAX_JOIN)
                    while data:
                        # (Looked up each time: set_protocol() may come.)
                        self._protocol.data_received(data)  # type: ignore[attr-defined]
                        if budget <= 0 or not channel.queued or self._paused_reading or self._closing:
                            break
                        data = channel.pull(_MAX_CHUNK, _MAX_JOIN)
                        budget -= len(data)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._fatal_error(exc, "Fatal error: protocol.data_received() call failed.")
            # The writer is done (else more may come), and this end still reads.
            if not (self._paused_reading or self._closing):
                if channel.state is not CHANNEL_OPEN:
                    self._drain_end(channel.seen())
                elif self._read_shut and not channel.queued:
                    self._deliver_eof()  # (TCP's read finds EOF then; the friend writes on)
        except BaseException:
            if outermost:
                drains.stop()
            raise
        if outermost:
            drains.left -= 1
            if drains.waiting or drains.left <= ASK_AT:
                drains.run_rounds(self._context)
            else:
                drains.running = False

    def _reading_shut(self) -> None:
        """Its socket's ``shutdown(SHUT_RD)``: as over TCP, EOF once what
        came before is delivered (``eof_received()``), and no more reading."""
        if not self._read_shut:
            self._read_shut = True
            if not (self._eof_delivered or self._closing):
                self._schedule_drain()

    def _drain_end(self, seen: Seen) -> None:
        """The writer is done: EOF or the reset once its bytes are read."""
        if seen is SEEN_RESET:
            error = self._end.take_error()
            if error is not None:
                self._force_close(error.as_os_error())
                return
            self._deliver_eof()  # reported already, as a read gets EOF then
        elif seen is SEEN_EOF:
            self._deliver_eof()
        # DATA: newer bytes, their drain is scheduled (EOF after them).

    def _drain_into_buffers(self) -> None:
        """``get_buffer()``/``buffer_updated()`` with what is queued now,
        until reading stops. Each call's failure is reported as asyncio
        reports it."""
        channel = self._in
        channel.begin_drain()
        budget = channel.queued
        while budget > 0 and channel.queued:
            protocol = self._protocol
            try:
                buffer = protocol.get_buffer(self._state.buffer_size_hint)  # type: ignore[attr-defined]
                if not len(buffer):
                    raise RuntimeError("get_buffer() returned an empty buffer")
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._fatal_error(exc, "Fatal error: protocol.get_buffer() call failed.")
                return
            size = channel.pull_into(memoryview(buffer).cast("B"))
            budget -= size
            try:
                protocol.buffer_updated(size)  # type: ignore[attr-defined]
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._fatal_error(exc, "Fatal error: protocol.buffer_updated() call failed.")
                return
            if self._paused_reading or self._closing:
                return

    def _deliver_eof(self) -> None:
        self._eof_delivered = True
        if self._state.stops_reading_at_eof:
            self._paused_reading = True
        try:
            keep_open = self._protocol.eof_received()  # type: ignore[attr-defined]
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.eof_received() call failed.")
            return
        if not keep_open:
            self.close()
