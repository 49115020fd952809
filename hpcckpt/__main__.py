"""``python -m hpcckpt``: the same command as the ``hpcckpt`` console script (see hpcckpt/cli/)."""

import sys

from hpcckpt.cli import main

if __name__ == "__main__":
    sys.exit(main())
