"""Progress bar on stderr: input bytes against the total (so tqdm gives an ETA) and
tokens per second."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    """A tqdm bar over input bytes with a tokens and tokens/s postfix, named by the
    first stage (``description``); silent when ``quiet`` (a disabled bar ignores updates)."""

    def __init__(self, total_bytes: int | None, quiet: bool, description: str) -> None:
        self.tokens = 0
        self._start = time.perf_counter()
        self._bar = tqdm(
            total=total_bytes or None,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=description,
            file=sys.stderr,
            disable=quiet,
            mininterval=0.5,
            dynamic_ncols=True,
        )

    def update(self, consumed_bytes: int, tokens: int) -> None:
        """Records input consumed and tokens produced since the last call."""
        self.tokens += tokens
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        done, rate = tqdm.format_sizeof(self.tokens), tqdm.format_sizeof(self.tokens / elapsed)
        self._bar.set_postfix_str(f"{done} tok, {rate} tok/s", refresh=False)
        self._bar.update(consumed_bytes)

    def stage(self, description: str) -> None:
        """Names the current stage (after reading: suffix arrays, writing)."""
        self._bar.set_description_str(description)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()
