"""Routing models: which experts each token uses. (Interface stub; see RoutingSpec.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .tomlio import Fields


@dataclass(frozen=True)
class RoutingSpec:
    """How router ids are drawn: ``kind`` is ``"uniform"``, ``"skewed"`` or ``"trace"``."""

    kind: str = "uniform"
    trace_file: Path | None = None


def routing_from_fields(f: Fields, model) -> RoutingSpec:
    kind = f.str("kind", "uniform", choices=("uniform", "skewed", "trace"))
    f.check_unknown()
    return RoutingSpec(kind=kind)


class Router:
    """Draws top-k expert ids per token for one layer."""

    def __init__(self, spec: RoutingSpec, n_expert: int, top_k: int, n_layer: int):
        self.spec, self.n_expert, self.top_k, self.n_layer = spec, n_expert, top_k, n_layer

    def sample(self, layer: int, n_tokens: int, rng: np.random.Generator, token_offset: int = 0) -> np.ndarray:
        """(n_tokens, top_k) int array of distinct expert ids per token."""
        return np.argsort(rng.random((n_tokens, self.n_expert)), axis=1)[:, : self.top_k]
