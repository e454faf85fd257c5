"""The trio adapter: friend streams, listeners and connects on trio."""
