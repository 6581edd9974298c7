"""Order statistics shared by the collector's windows and the dispatcher's path discovery."""

from __future__ import annotations

import math


def quantile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank quantile of sorted values (Flux exact_selector): index ceil(q * n) - 1."""
    index = math.ceil(q * len(sorted_values))
    return sorted_values[index - 1 if index > 0 else 0]
