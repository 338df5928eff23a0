"""Hand-off timing shared by the Python baselines (zk_kazoo.py,
mc_sherlock.py): the same measure as src/cli/timing.rs, so their figures
and ours mean the same thing."""

import math
import threading
import time


class HandOffs:
    """Release-to-grant gaps between different clients (cf. src/cli/timing.rs)."""

    def __init__(self):
        self.mutex = threading.Lock()
        self.last = None  # (releaser id, monotonic time its release started)
        self.gaps = []

    def granted(self, cid):
        now = time.monotonic()
        with self.mutex:
            if self.last is not None and self.last[0] != cid:
                self.gaps.append(now - self.last[1])
            self.last = None

    def releasing(self, cid):
        with self.mutex:
            self.last = (cid, time.monotonic())


def percentile_us(sorted_gaps, p):
    """Nearest-rank quantile in microseconds, as timing.rs picks it."""
    if not sorted_gaps:
        return None
    i = min(max(math.ceil(len(sorted_gaps) * p), 1), len(sorted_gaps)) - 1
    return round(sorted_gaps[i] * 1e6, 1)
