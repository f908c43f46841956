"""``python -m sim``: the ``prefetch-sim`` command line."""
import sys

from sim.cli import main

sys.exit(main())
