"""``python -m hpcckpt.slurm``: what hpcckpt detects of the SLURM job it runs in (``--json`` for a machine)."""

import sys

from hpcckpt.slurm import main

if __name__ == "__main__":
    sys.exit(main())
