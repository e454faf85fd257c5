"""The asyncio adapter: friend transports, pairing, servers, front door."""
