"""CPU and wall time per 64 B round trip through asyncio streams over TLS on
uvloop: a StreamReader/StreamWriter echo server (``ssl=``) and a client
writing 64 B and reading them back, 20,000 times after 500 of warm-up, over
uvloop's TCP or a friend link.

    python benchmarks/tls_streams_rr.py friends
    python benchmarks/tls_streams_rr.py tcp
"""

import asyncio
import ssl
import sys
import time

import trustme
import uvloop

import friendsock

ca = trustme.CA()
cert = ca.issue_cert("localhost")
sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
cert.configure_cert(sctx)
cctx = ssl.create_default_context()
ca.configure_trust(cctx)
mode = sys.argv[1]
N = 20000
async def main():
    async def handle(r, w):
        while d := await r.read(65536):
            w.write(d)
        w.close()
    if mode == "tcp":
        srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=sctx)
        oc = asyncio.open_connection
    else:
        srv = await friendsock.start_server(handle, "127.0.0.1", 0, ssl=sctx)
        oc = friendsock.open_connection
    port = srv.sockets[0].getsockname()[1]
    r, w = await oc("127.0.0.1", port, ssl=cctx, server_hostname="localhost")
    assert friendsock.is_friend(w) is (mode != "tcp")
    msg = b"x" * 64
    async def loop_(n):
        for _ in range(n):
            w.write(msg)
            await r.readexactly(64)
    await loop_(500)
    c0 = time.process_time()
    t0 = time.perf_counter()
    await loop_(N)
    cpu = (time.process_time() - c0) / N * 1e6
    wall = (time.perf_counter() - t0) / N * 1e6
    print(f"{mode}: CPU {cpu:.2f} us, wall {wall:.2f} us per round trip")
    w.close()
    srv.close()
uvloop.run(main())
