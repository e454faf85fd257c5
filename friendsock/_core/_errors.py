"""The core's one error vocabulary; each adapter translates it in one place."""

from __future__ import annotations


class FriendError(Exception):
    """Base of every error the core raises."""


class ChannelShutdownError(FriendError):
    """The writing end already sent EOF (or was aborted) on this channel."""


class PeerResetError(FriendError):
    """The peer reset the link: what TCP reports as ECONNRESET."""
