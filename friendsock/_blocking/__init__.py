"""Blocking sockets in threads: ``friendsock.patch_socket()``."""
