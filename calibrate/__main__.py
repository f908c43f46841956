import sys

from sim.cli.interrupt import run_interruptible

from .cli import main

sys.exit(run_interruptible("calibrate", main))  # Ctrl-C / SIGTERM: one line, 130 / 143
