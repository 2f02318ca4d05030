"""``python -m filesync.agent SOCKET SECONDS``: the agent process the CLI starts."""

import sys

from filesync.agent.server import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
