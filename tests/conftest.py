"""Hypothesis profiles for the property tests.

``default`` (what ``pytest`` and CI run): derandomised, so every run draws the same examples and
the suite's outcome depends on the code alone, never on a new draw. ``explore``
(``HYPOTHESIS_PROFILE=explore pytest ...``): fresh random examples each run, to look for new
failures; a failure it finds is kept in ``.hypothesis/`` and replayed until fixed.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
