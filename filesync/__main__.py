"""``python -m filesync``: the command line."""

from filesync.cli.main import run

if __name__ == "__main__":
    run()
