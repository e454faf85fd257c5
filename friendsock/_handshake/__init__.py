"""The socket-level steps of pairing, shared by the asyncio and trio adapters.

No event loop here: plain sockets and the registry. A client registers its
pending connect before the ``connect()`` syscall (:func:`register_connect`;
an address at a time: :class:`ConnectAttempt`); the accepting side claims it
by the flow key of the accepted socket (:func:`claim_accepted`). Either side
may be asyncio or trio: what the other side needs of a listener or a client
end is in :class:`ListenerHandle` and :class:`ClientEnd`.

By concern: ``_process`` (whose the real sockets are, and letting them go),
``_listener`` (listeners, their kept connections and accept queues),
``_binding`` (a connect's socket bound before ``connect()``), ``_connect``
(the connecting side), ``_claim`` (the accepting side, and the pairing
check), ``_tcp_info`` (what the kernel says of a connection). What the
adapters use is named here.
"""

from __future__ import annotations

from ._binding import (
    _EphemeralPorts,
    first_host,
    is_bound,
    numeric_address_infos,
    users_sockname,
)
from ._claim import (
    accept_from,
    adopt_accepted,
    call_on_claim,
    check_link_names,
    claim_accepted,
    confirmed,
    go_tcp,
    hold_ended,
    offer_for_reuse,
    settle_held,
)
from ._connect import (
    ConnectAttempt,
    abandon_connect,
    adoptable_connecting,
    fallback_address,
    make_room,
    named_as_registered,
    register_adoptable_connect,
    register_connect,
    start_connect,
    RoomWait,
    why_not_friends,
)
from ._listener import (
    KEPT_PER_LISTENER,
    ClientEnd,
    Entry,
    ListenerHandle,
    Pending,
    forget_listener,
    forget_when_collected,
    register_listener,
)
from ._process import SocketRelease, current_pid
from ._tcp_info import family_of, is_listening, is_tcp_socket, payload_moved

# How long a confirmed connect (a listener that other processes may share)
# waits for this process to claim it before it goes on as plain TCP. The
# adapters read it (and ROOM_RECHECK) here at each use: tests change it.
CONFIRM_TIMEOUT = 0.25
# How often a connect held back by a full accept queue looks again, in case
# room was made by an accept friendsock did not see.
ROOM_RECHECK = 1.0

__all__ = [
    "abandon_connect",
    "accept_from",
    "adopt_accepted",
    "adoptable_connecting",
    "call_on_claim",
    "check_link_names",
    "claim_accepted",
    "ClientEnd",
    "CONFIRM_TIMEOUT",
    "confirmed",
    "ConnectAttempt",
    "current_pid",
    "Entry",
    "_EphemeralPorts",
    "family_of",
    "fallback_address",
    "first_host",
    "forget_listener",
    "forget_when_collected",
    "go_tcp",
    "hold_ended",
    "is_bound",
    "is_listening",
    "is_tcp_socket",
    "KEPT_PER_LISTENER",
    "ListenerHandle",
    "make_room",
    "named_as_registered",
    "numeric_address_infos",
    "offer_for_reuse",
    "payload_moved",
    "Pending",
    "register_adoptable_connect",
    "register_connect",
    "register_listener",
    "ROOM_RECHECK",
    "settle_held",
    "SocketRelease",
    "start_connect",
    "users_sockname",
    "RoomWait",
    "why_not_friends",
]
