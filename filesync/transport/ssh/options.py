"""The caller's own ``ssh`` options (``Session(ssh_options=...)``), checked before use.

Guarantees:

- Options only: every argument is an option or the value of the option before it, so no
  stray word can become the destination (or the remote command) of filesync's ``ssh``.
- Options that would break filesync's use of ``ssh`` are refused with one ``UsageError``
  line naming them: a tty (``-t``), no command (``-N``, ``-f``, ``-n``, ``-s``, ``-W``), a
  master of the caller's making (``-M``), a control command (``-O``), another mode
  (``-G``, ``-Q``, ``-V``), stderr sent to a file (``-E``, where filesync reads ssh's errors).
- ``-S PATH`` becomes ``-o ControlPath=PATH``: for ``-o`` options the first value given
  wins, which lets filesync's own master keep its own socket (``-S`` would override it).
"""

from __future__ import annotations

from collections.abc import Sequence

from filesync.errors import UsageError

# OpenSSH's option letters that take a value (ssh.c's getopt string).
_WITH_VALUE = set("bceilmopBDEFIJLOPQRSwW")
_REFUSED = {
    "t": "a tty would mangle the stream",
    "N": "filesync runs commands",
    "f": "filesync runs commands",
    "n": "filesync feeds commands their input",
    "s": "filesync runs commands, not subsystems",
    "W": "filesync runs commands",
    "M": "filesync starts its own master, or rides yours through -o ControlPath=PATH",
    "O": "filesync controls its own master",
    "G": "filesync resolves the config itself",
    "Q": "filesync connects",
    "V": "filesync connects",
    "E": "filesync reads ssh's errors from stderr",
}


def check_ssh_options(options: Sequence[str]) -> list[str]:
    """``options`` as ``ssh`` arguments; ``UsageError`` for anything else (see above)."""
    if isinstance(options, str):
        raise UsageError('ssh_options takes a list of arguments, not one string: write '
                         '["-o", "ControlPath=PATH"]')
    args = list(options)
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not isinstance(arg, str) or not arg.startswith("-") or arg in ("-", "--"):
            raise UsageError(f"ssh_options: {arg!r} is not an ssh option; give options "
                             'only, such as ["-o", "ControlPath=PATH"]')
        letters = arg[1:]
        for n, letter in enumerate(letters):
            if letter in _REFUSED:
                raise UsageError(f"ssh_options: -{letter} is not allowed "
                                 f"({_REFUSED[letter]}); leave it out")
            if letter in _WITH_VALUE:
                value = letters[n + 1:]
                if not value:
                    i += 1
                    if i == len(args) or not isinstance(args[i], str):
                        raise UsageError(f"ssh_options: -{letter} needs a value; "
                                         f'write ["-{letter}", "VALUE"]')
                    value = args[i]
                flags = letters[:n]
                if flags:
                    out.append(f"-{flags}")
                out += ["-o", f"ControlPath={value}"] if letter == "S" else [f"-{letter}", value]
                break
        else:
            out.append(arg)
        i += 1
    return out
