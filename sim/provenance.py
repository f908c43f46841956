"""Which code made a measurement: recorded in validation metadata and calibration profiles."""
from __future__ import annotations

import subprocess
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def code_version(root: str | Path | None = None) -> str:
    """The code's version for the record: ``"git <commit>"`` (12 hex digits), with
    ``"+dirty"`` when tracked files differ from that commit, when ``root`` (default: this
    checkout) is a git work tree and git runs; otherwise ``"prefetch-sim <version>
    (no git)"`` from the installed package metadata, or ``"unknown"``. Never raises.

    Returns:
        str, for example ``"git 63e8043a1b2c"`` or ``"prefetch-sim 0.1.0 (no git)"``.
    """
    where = str(root or _ROOT)
    try:
        head = subprocess.run(["git", "-C", where, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0 and head.stdout.strip():
            st = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
            dirty = "+dirty" if st.returncode == 0 and st.stdout.strip() else ""
            return f"git {head.stdout.strip()}{dirty}"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return f"prefetch-sim {version('prefetch-sim')} (no git)"
    except Exception:  # noqa: BLE001 - provenance must never fail a run
        return "unknown"
