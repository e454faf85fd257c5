"""The sans-IO core: pairing registry, friend links, accounting, statistics.

Nothing in this package imports asyncio or trio, or touches a socket: the
adapters own I/O and scheduling, and translate this package's errors.
"""
