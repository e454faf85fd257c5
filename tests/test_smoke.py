
from support import connected_pair


async def test_echo_roundtrip(friends):
    async with connected_pair(friends) as (transport, client, server):
        transport.write(b"ping")
        assert await server.wait_bytes(4) == b"ping"
        server.transport.write(b"pong")
        assert await client.wait_bytes(4) == b"pong"
        assert client.events == ["made", "data"]
