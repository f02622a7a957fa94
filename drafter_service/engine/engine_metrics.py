"""What the drafting engine reports, as a protocol: the service's Prometheus collector
(``drafter_service.metrics.drafter_metrics.DrafterMetrics``) takes it, and the engine needs
nothing of Prometheus."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt


class EngineMetrics(Protocol):
    """What the engine reports (``metrics.drafter_metrics.DrafterMetrics`` is one)."""

    def count_resync(self, reason: str, n: int = 1) -> None: ...

    def record_trees(
        self, datastore: str, offsets: npt.NDArray[np.int64], job_seconds: float
    ) -> None: ...
