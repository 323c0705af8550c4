"""``python -m stability.cli ...`` (the same as the ``stability`` command)."""

import sys

from stability.cli import main

if __name__ == "__main__":   # not when a child process ("spawn") imports this module again
    sys.exit(main())
