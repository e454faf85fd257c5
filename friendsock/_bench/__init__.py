"""``python -m friendsock bench``: a netperf-style comparison of real TCP,
AF_UNIX and friend links, in the table form of the kernel patch's results.

Private package: the command line (``_cli``) is the interface.
"""
