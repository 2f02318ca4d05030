"""Transports: how a remote process is started (local, a command prefix, SSH)."""
