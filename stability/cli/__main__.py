"""``python -m stability.cli ...`` (the same as the ``stability`` command)."""

import sys

from stability.cli import main

sys.exit(main())
