"""The command line: argparse, typed options from it, exit codes, one-line errors."""

from filesync.cli.main import main

__all__ = ["main"]
