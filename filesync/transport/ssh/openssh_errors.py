"""What a failed ``ssh`` said, as one line naming the cause and the fix.

``ssh`` exits 255 for its own errors and explains them on stderr (plus, here, the
``-v`` debug lines of the master, which show the server's host key and the keys that
were tried). :func:`explain` reads that text and returns a ``TransportError`` whose
message is one line: ``<cause>; <fix>``. It depends on ssh's wording only to pick the
case and the details (fingerprint, file, key paths); an unrecognised failure still
yields one line, with ssh's own last message and a ``ssh -v`` hint.

Standard library only: the OpenSSH path never imports asyncssh or cryptography.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from pathlib import Path

from filesync.errors import TransportError
from filesync.transport.ssh.destination import DEFAULT_PORT

_NOISE = (
    "debug",
    "OpenSSH_",
    "Warning: Permanently added",
    "Pseudo-terminal will not be allocated",
    "Authenticated to",
    "Transferred:",
    "Bytes per second:",
)
_UNKNOWN = re.compile(r"No (\S+) host key is known for (\S+) and you have requested strict")
_SERVER_KEY = re.compile(r"debug1: Server host (?:key|certificate): (\S+) (SHA256:[^\s,]+)")
_CHANGED_FOR = re.compile(r"Host key for (\S+) has changed")
_OFFENDING = re.compile(r"Offending .* in (.+):\d+$")
_SENT_KEY = re.compile(r"The fingerprint for the (\S+) key sent by the remote host is")
_KEY_LINE = re.compile(
    r"debug1: (?:Will attempt key|Offering public key|Trying private key): (.+)$"
)
_KEY_DETAILS = re.compile(r" [A-Z0-9-]+ SHA256:\S+.*$")
_CONNECT = re.compile(r"connect to host (\S+) port (\d+): (.+)$")
_RESOLVE = re.compile(r"Could not resolve hostname (\S+): (.+)$")


@dataclass
class Context:
    """What filesync knows about the connection that failed."""

    label: str  # "root@box (10.0.0.5)"
    alias: str
    host: str
    port: int
    user: str
    known_hosts: str  # the first UserKnownHostsFile, where accepted keys go
    identity_files: list[Path] = field(default_factory=list)
    agent: bool = False
    tty: bool = False


def messages(text: str) -> list[str]:
    """ssh's own lines: debug output, banners and notices left out."""
    lines = [line.strip().removeprefix("ssh: ") for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith(_NOISE)]


def _short_type(algorithm: str) -> str:
    """``ssh-ed25519`` (or ``ED25519``) -> ``ed25519``: the ``-t`` spelling of ``ssh-keyscan``."""
    lowered = algorithm.lower()
    for short in ("ed25519", "ecdsa", "rsa"):
        if short in lowered:
            return short
    return lowered


def _host_port(spelled: str) -> tuple[str, int]:
    """``[host]:port`` (known_hosts spelling) or ``host`` -> (host, port)."""
    match = re.fullmatch(r"\[(.+)\]:(\d+)", spelled)
    return (match.group(1), int(match.group(2))) if match else (spelled, DEFAULT_PORT)


def key_is_encrypted(path: Path) -> bool:
    """True if the private key file at ``path`` needs a passphrase (OpenSSH or PEM format)."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")[:1 << 16]
    except OSError:
        return False
    if "BEGIN OPENSSH PRIVATE KEY" in text:
        body = "".join(line for line in text.splitlines() if line and "-----" not in line)
        try:
            data = base64.b64decode(body)
        except (binascii.Error, ValueError):
            return False
        magic = b"openssh-key-v1\0"
        if not data.startswith(magic) or len(data) < len(magic) + 4:
            return False
        size = int.from_bytes(data[len(magic):len(magic) + 4], "big")
        return data[len(magic) + 4:len(magic) + 4 + size] != b"none"
    return "ENCRYPTED" in text


def tried_keys(text: str) -> list[str]:
    """The keys ssh's debug output says it tried, in order (agent keys as ``ssh-agent``)."""
    tried: list[str] = []
    for line in text.splitlines():
        match = _KEY_LINE.match(line.strip())
        if match:
            rest = match.group(1)
            name = "ssh-agent" if rest.endswith(" agent") else _KEY_DETAILS.sub("", rest)
            if name not in tried:
                tried.append(name)
    return tried


def explain(stderr: str, ctx: Context) -> TransportError:
    """The one-line error for a connection attempt that ssh gave up on."""
    lines = messages(stderr)
    joined = "\n".join(lines)
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in joined or _CHANGED_FOR.search(joined):
        return _changed(stderr, ctx)
    unknown = _UNKNOWN.search(joined)
    if unknown or "Host key verification failed" in joined:
        return _unknown(stderr, ctx, unknown)
    if "Permission denied" in joined:
        return _denied(stderr, ctx)
    for line in lines:
        if found := _CONNECT.search(line):
            return _connect_failed(ctx, found.group(3).rstrip("."))
        if found := _RESOLVE.search(line):
            return TransportError(
                f"cannot resolve host name {found.group(1)!r} ({found.group(2).rstrip('.')}); "
                "check the spelling or the HostName in your ssh config"
            )
    for line in lines:
        if "Bad configuration option" in line or "Can't open user config" in line or (
            "line " in line and ": " in line and "config" in line.lower()
        ):
            return TransportError(f"ssh cannot use its config ({line}); fix the ssh config")
        if line.startswith("Unable to negotiate"):
            return TransportError(
                f"cannot agree on SSH algorithms with {ctx.label} ({line}); check the "
                "KexAlgorithms/Ciphers/HostKeyAlgorithms settings on both sides"
            )
        if "open failed" in line or "stdio forwarding failed" in line:
            return TransportError(
                f"jump host could not reach {ctx.label} ({line}); check HostName/Port of the "
                "target as seen from the jump host"
            )
        if line.startswith(("kex_exchange_identification", "Connection closed by",
                            "Connection reset by", "banner exchange")):
            return TransportError(
                f"{ctx.label} closed the connection during login ({line}); check that it "
                "runs sshd on that port and its logs (MaxStartups, AllowUsers)"
            )
    last = lines[-1] if lines else "no message"
    return TransportError(
        f"ssh to {ctx.label} failed ({last}); run `ssh -v {ctx.alias}` to see why"
    )


def _connect_failed(ctx: Context, reason: str) -> TransportError:
    if "refused" in reason.lower():
        return TransportError(
            f"connection to {ctx.label} refused; check that sshd runs there and the port is "
            "right (Port in ssh config, or ssh://host:PORT/path)"
        )
    if "timed out" in reason.lower():
        return TransportError(
            f"connecting to {ctx.label} timed out; check that the host is up and reachable "
            "(VPN, firewall) and the port is right"
        )
    return TransportError(
        f"cannot connect to {ctx.label} ({reason}); check the network and the address"
    )


def _who(ctx: Context, host: str) -> str:
    """The label for the host a message is about: the target, or a jump host."""
    return ctx.label if host in (ctx.host, ctx.alias) else f"jump host {host}"


def _changed(stderr: str, ctx: Context) -> TransportError:
    sent = _SENT_KEY.search(stderr)
    lines = stderr.splitlines()
    fingerprint = ""
    for i, line in enumerate(lines):
        if sent and sent.group(0) in line and i + 1 < len(lines):
            fingerprint = lines[i + 1].strip().rstrip(".")
    algorithm = sent.group(1) if sent else "host key"
    where = _CHANGED_FOR.search(stderr)
    lookup = where.group(1) if where else ctx.host
    offending = next((m.group(1) for line in lines if (m := _OFFENDING.search(line.strip()))),
                     ctx.known_hosts)
    host, _port = _host_port(lookup)
    return TransportError(
        f"host key of {_who(ctx, host)} CHANGED (now {algorithm} {fingerprint}) - possibly a "
        "man-in-the-middle attack; if the change is expected, remove the old key with "
        f"`ssh-keygen -R '{lookup}' -f {offending}` and rerun"
    )


def _unknown(stderr: str, ctx: Context, unknown: re.Match[str] | None) -> TransportError:
    offered = _SERVER_KEY.search(stderr)
    if unknown is None or offered is None:
        reason = next((line for line in messages(stderr) if "host key" in line.lower()),
                      "Host key verification failed")
        return TransportError(
            f"host key of {ctx.label} was not accepted ({reason.rstrip('.')}); check the "
            f"known_hosts files ({ctx.known_hosts}) and StrictHostKeyChecking in your ssh config"
        )
    host, port = _host_port(unknown.group(2))
    algorithm, fingerprint = offered.group(1), offered.group(2)
    return unknown_host_key(_who(ctx, host), f"{algorithm} {fingerprint}", host, port,
                            _short_type(algorithm), ctx.known_hosts)


def unknown_host_key(who: str, key: str, host: str, port: int, key_type: str,
                     known_hosts: str) -> TransportError:
    """The one line for an unknown host key, for either SSH client: the key, the exact
    ``ssh-keyscan`` line that trusts it, and ``--accept-new-host-key``."""
    port_flag = "" if port == DEFAULT_PORT else f"-p {port} "
    return TransportError(
        f"host key of {who} is unknown ({key}); after checking it, add it with "
        f"`ssh-keyscan {port_flag}-t {key_type} {host} >> {known_hosts}`, "
        "or rerun with --accept-new-host-key"
    )


def _denied(stderr: str, ctx: Context) -> TransportError:
    tried = tried_keys(stderr)
    locked = [str(p) for p in ctx.identity_files if str(p) in tried and key_is_encrypted(p)]
    if locked and not ctx.tty:
        key = locked[0]
        return TransportError(
            f"authentication as {ctx.user} on {ctx.label} failed: the key {key} is "
            "passphrase-protected and no ssh-agent offered it; load it with "
            f"`ssh-add {key}`, or run filesync from a terminal so ssh can ask for it"
        )
    if ctx.agent and "ssh-agent" not in tried:
        tried.append("ssh-agent")
    return TransportError(
        f"authentication as {ctx.user} on {ctx.label} failed (tried: "
        f"{', '.join(tried) or 'no keys found'}); check that your public key is in "
        f"~{ctx.user}/.ssh/authorized_keys there, pass the right key with -i KEY, "
        "or load it with ssh-add"
    )
