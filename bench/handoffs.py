"""Hand-off timing and the contention run shared by the Python baselines
(zk_kazoo.py, mc_sherlock.py): the same measure as cli-kit/src/timing.rs, so
their figures and ours mean the same thing."""

import math
import threading
import time


class HandOffs:
    """Release-to-grant gaps between different clients (cf. cli-kit/src/timing.rs)."""

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


def run_contended(locks, seconds, acquire):
    """One thread per lock (each on its own client), all on one key: loop
    acquire, a tiny critical section, release, for `seconds`; the counts
    and hand-off figures, as the Rust side reports them."""
    handoffs = HandOffs()
    counts = [0] * len(locks)
    errors = []
    ready = threading.Barrier(len(locks) + 1)
    deadline = None

    def run(cid):
        lock = locks[cid]
        try:
            ready.wait()
            while time.monotonic() < deadline:
                acquire(lock)
                handoffs.granted(cid)
                counts[cid] += 1
                time.sleep(0)  # the tiny critical section: yield once
                handoffs.releasing(cid)
                lock.release()
        except Exception as e:  # reported by the main thread
            errors.append(f"client {cid}: {type(e).__name__}: {e}")
            ready.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(locks))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    ready.wait()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    gaps = sorted(handoffs.gaps)
    return {
        "mode": "contended",
        "contenders": len(locks),
        "seconds": seconds,
        "locks": sum(counts),
        "counts": counts,
        "handoff_p50_us": percentile_us(gaps, 0.5),
        "handoff_p99_us": percentile_us(gaps, 0.99),
        "handoffs": len(gaps),
    }
