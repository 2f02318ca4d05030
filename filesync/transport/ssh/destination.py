"""How an SSH destination is named in messages, by both SSH clients alike."""

from __future__ import annotations

#: The SSH port a label leaves unsaid.
DEFAULT_PORT = 22


def ssh_label(user: str, alias: str, host: str, port: int) -> str:
    """``user@alias (host:port)``: the alias only when it is not the host name, the port
    only when it is not 22."""
    shown = host if port == DEFAULT_PORT else f"{host}:{port}"
    if alias != host:
        shown = f"{alias} ({shown})"
    return f"{user}@{shown}"
