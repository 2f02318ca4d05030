"""``python -m filesync.cli``: the command line."""

import sys

from filesync.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
