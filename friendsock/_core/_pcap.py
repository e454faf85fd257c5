"""The TCP segments a real connection with a friend link's 4-tuple would
carry, as classic libpcap records (sans-IO: the caller writes the bytes).

A :class:`TcpFlow` keeps each direction's next sequence number; every
method returns the records of one event (the handshake, a write, a FIN, a
reset) as a list of buffers, ready for ``os.writev``: a record's headers in
one ``bytes``, its payload as a view of the written buffer, never copied.

The frames are Ethernet with zero addresses, as ``tcpdump -i lo`` records
them, so every reader (Wireshark, tshark, dpkt, scapy) takes them as they
are. The receiver's kernel acknowledges each segment at once (as loopback
does), so no segment is ever beyond the window it advertises.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, List, Tuple, Union

from ._addresses import normalize_endpoint

Buffer = Union[bytes, memoryview]

PCAP_MAGIC = 0xA1B2C3D4  # microsecond timestamps
SNAPLEN = 262144  # tcpdump's default: every record here is whole
LINKTYPE_ETHERNET = 1
FILE_HEADER = struct.pack("<IHHiIII", PCAP_MAGIC, 2, 4, 0, 0, SNAPLEN, LINKTYPE_ETHERNET)

MAX_IP_PACKET = 65535  # IPv4's total length (and a loopback IPv6 packet's) fits 16 bits
TCP_HEADER = 20
_IPV4_HEADER = 20
_IPV6_HEADER = 40
WINDOW = 65535  # advertised always: each segment is acknowledged before the next

FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10

CLIENT, SERVER = 0, 1  # who sends

_RECORD = struct.Struct("<IIII")
_ETHER_IPV4 = bytes(12) + b"\x08\x00"
_ETHER_IPV6 = bytes(12) + b"\x86\xdd"
# IP and TCP headers in one pack: version/IHL, TOS, total length, id,
# flags (DF), TTL, protocol, checksum, addresses; then TCP.
_IPV4_TCP = struct.Struct("!BBHHHBBH8sHHIIBBHHH")
# Version/class/label, payload length, next header, hop limit, addresses; then TCP.
_IPV6_TCP = struct.Struct("!IHBB32sHHIIBBHHH")
_MSS_OPTION = struct.Struct("!BBH")
_SEQ_MASK = 0xFFFFFFFF
_TTL = 64
_DONT_FRAGMENT = 0x4000
# int.from_bytes per piece of this many bytes (even: each piece's words stay
# words): a sum of pieces leaves a remainder of a piece's size to take, not
# of the whole payload's, which is what costs.
_SUM_PIECE = 4096


def ones_sum(data: Buffer) -> int:
    """The ones' complement sum of ``data``'s 16-bit big-endian words,
    modulo 0xFFFF, at C speed: 2**16 is 1 modulo 0xFFFF, so an integer made
    of the bytes leaves its words' sum as remainder. Read little-endian,
    which converts faster, then byte-swapped (x 256), which the ones'
    complement sum allows (RFC 1071); an odd last byte counts as TCP pads it."""
    size = len(data)
    if size <= _SUM_PIECE:
        total = int.from_bytes(data, "little")
    else:
        view = memoryview(data)
        total = sum([int.from_bytes(view[i:i + _SUM_PIECE], "little")
                     for i in range(0, size, _SUM_PIECE)])
    return (total % 0xFFFF) * 256 % 0xFFFF


def fold_checksum(total: int) -> int:
    """The checksum field for data whose words add up to ``total``."""
    rest = total % 0xFFFF
    return 0xFFFF - rest if rest else 0


class _Sender:
    """One direction's addresses and counters, and the parts of its
    checksums that never change."""

    __slots__ = ("src_port", "dst_port", "next_seq", "ip_id", "addresses", "tcp_sum", "ip_sum")

    def __init__(self, src: Tuple[str, int], dst: Tuple[str, int], family: int, isn: int) -> None:
        self.src_port = src[1]
        self.dst_port = dst[1]
        self.next_seq = isn
        self.ip_id = 0
        self.addresses = socket.inet_pton(family, src[0]) + socket.inet_pton(family, dst[0])
        # Any 16-bit-aligned field adds its value: 2**16 is 1 modulo 0xFFFF.
        # TCP: the pseudo-header's addresses and protocol, the ports, the window.
        address_sum = int.from_bytes(self.addresses, "big")
        self.tcp_sum = address_sum + socket.IPPROTO_TCP + (src[1] << 16 | dst[1]) + WINDOW
        # IPv4: version/IHL, DF, TTL/protocol, the addresses.
        self.ip_sum = 0x4500 + _DONT_FRAGMENT + (_TTL << 8 | socket.IPPROTO_TCP) + address_sum


class TcpFlow:
    """The segments of one connection: ``client`` connected to ``server``
    (socket addresses as the ends report them), with these initial sequence
    numbers."""

    __slots__ = ("v6", "mss", "senders")

    def __init__(self, client: Any, server: Any, client_isn: int, server_isn: int) -> None:
        client = normalize_endpoint(client)
        server = normalize_endpoint(server)
        self.v6 = ":" in client[0] or ":" in server[0]
        family = socket.AF_INET6 if self.v6 else socket.AF_INET
        self.mss = MAX_IP_PACKET - (_IPV6_HEADER if self.v6 else _IPV4_HEADER) - TCP_HEADER
        self.senders = (
            _Sender(client, server, family, client_isn & _SEQ_MASK),
            _Sender(server, client, family, server_isn & _SEQ_MASK),
        )

    # -- events ------------------------------------------------------------
    def handshake(self, ts_ns: int) -> List[Buffer]:
        """SYN, SYN-ACK, ACK (the SYNs announce our segment size)."""
        mss = _MSS_OPTION.pack(2, 4, self.mss)
        syn = self._segment(CLIENT, SYN, ts_ns, options=mss)
        syn_ack = self._segment(SERVER, SYN | ACK, ts_ns, options=mss)
        return [syn, syn_ack, self._segment(CLIENT, ACK, ts_ns)]

    def data(self, sender: int, payload: Buffer, ts_ns: int, acked: bool = True) -> List[Buffer]:
        """``payload`` in segments of at most ``mss`` bytes, PSH on the last,
        each acknowledged by the receiver (``acked``; a receiver that is
        gone answers with a reset instead, see :meth:`reset`)."""
        view = memoryview(payload)
        size = len(view)
        records: List[Buffer] = []
        mss = self.mss
        start = 0
        while start < size:
            piece = view[start:start + mss]
            start += len(piece)
            flags = ACK | PSH if start >= size else ACK
            records.append(self._segment(sender, flags, ts_ns, piece))
            records.append(piece)
            if acked:
                records.append(self._segment(1 - sender, ACK, ts_ns))
        return records

    def fin(self, sender: int, ts_ns: int) -> List[Buffer]:
        """FIN, and the receiver's acknowledgement of it."""
        return [self._segment(sender, FIN | ACK, ts_ns), self._segment(1 - sender, ACK, ts_ns)]

    def reset(self, sender: int, ts_ns: int) -> List[Buffer]:
        """RST (with ACK, as Linux sends it when it closes with data unread)."""
        return [self._segment(sender, RST | ACK, ts_ns)]

    # -- one segment ---------------------------------------------------------
    def _segment(self, sender: int, flags: int, ts_ns: int, payload: Buffer = b"",
                 options: bytes = b"") -> bytes:
        """The record's headers (pcap, Ethernet, IP, TCP) for one segment of
        ``payload``, and the sender's sequence number moved past it. The
        payload itself is the caller's to write after them."""
        me = self.senders[sender]
        seq = me.next_seq
        ack = self.senders[1 - sender].next_seq if flags & ACK else 0
        size = len(payload)
        tcp_length = TCP_HEADER + len(options) + size
        offset_flags = ((TCP_HEADER + len(options)) // 4) << 12 | flags
        total = me.tcp_sum + tcp_length + seq + ack + offset_flags
        if size:
            total += ones_sum(payload)
        if options:
            total += int.from_bytes(options, "big")
        checksum = fold_checksum(total)
        me.next_seq = (seq + size + (1 if flags & (SYN | FIN) else 0)) & _SEQ_MASK
        if self.v6:
            headers = _IPV6_TCP.pack(6 << 28, tcp_length, socket.IPPROTO_TCP, _TTL, me.addresses,
                                     me.src_port, me.dst_port, seq, ack, offset_flags >> 8,
                                     flags, WINDOW, checksum, 0)
            ether = _ETHER_IPV6
            frame = 14 + _IPV6_HEADER + tcp_length
        else:
            ip_id = me.ip_id
            me.ip_id = (ip_id + 1) & 0xFFFF
            ip_length = _IPV4_HEADER + tcp_length
            ip_checksum = fold_checksum(me.ip_sum + ip_length + ip_id)
            headers = _IPV4_TCP.pack(0x45, 0, ip_length, ip_id, _DONT_FRAGMENT, _TTL,
                                     socket.IPPROTO_TCP, ip_checksum, me.addresses,
                                     me.src_port, me.dst_port, seq, ack, offset_flags >> 8,
                                     flags, WINDOW, checksum, 0)
            ether = _ETHER_IPV4
            frame = 14 + ip_length
        seconds, nanoseconds = divmod(ts_ns, 1_000_000_000)
        record = _RECORD.pack(seconds, nanoseconds // 1000, frame, frame)
        return record + ether + headers + options
