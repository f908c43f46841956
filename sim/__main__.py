"""``python -m sim``: the ``prefetch-sim`` command line."""
import sys

from .cli import main

sys.exit(main())
