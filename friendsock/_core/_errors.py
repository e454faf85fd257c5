"""The core's one error vocabulary; each adapter translates it in one place."""

from __future__ import annotations

import os


class FriendError(Exception):
    """Base of every error the core raises."""


class ChannelShutdownError(FriendError):
    """The writing end already sent EOF (or was aborted) on this channel."""


class PeerResetError(FriendError):
    """The peer reset the link: what TCP reports as ECONNRESET."""


class LinkBrokenError(FriendError):
    """A socket call on this end would fail now, with ``errno``: what a send
    or shutdown gets after the friend's reset, or a read on a reset link."""

    def __init__(self, errno: int) -> None:
        super().__init__(errno, os.strerror(errno))
        self.errno = errno

    def as_os_error(self) -> OSError:
        """The OSError a socket call raises for this errno: OSError picks
        the subclass (ConnectionResetError, BrokenPipeError, ...) itself."""
        return OSError(self.errno, os.strerror(self.errno))


class PairingCheckError(RuntimeError):
    """``FRIENDSOCK_CHECK_PAIRING``: a link's ends are not named alike by the
    kernel (a case friendsock does not know of, which would lose bytes).
    Deliberately no :class:`FriendError`: no adapter translates it, so it
    reaches the program with its traceback."""
