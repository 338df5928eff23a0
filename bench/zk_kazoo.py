"""Baseline for `lockwright-bench zookeeper`: Python kazoo's ZooKeeper lock.

Measures kazoo.recipe.lock.Lock against a live ZooKeeper server, in one of
two modes, and prints exactly one JSON line on stdout (errors go to stderr,
with a nonzero exit status):

  uncontended  one client, one lock: N sequential acquire(blocking=False) +
               release pairs, timed after a 50-pair warm-up. --recipe picks
               Lock (default), Semaphore (of 3), ReadLock or WriteLock.
  contended    C threads, each with its own KazooClient (own session), loop
               blocking acquire / tiny critical section / release on one
               lock for T seconds. Hand-off latency runs from one client's
               release start to the next grant to a different client, the
               same measure as cli-kit/src/timing.rs.

`lockwright-bench zookeeper` runs this as a subprocess and prints its figures
beside its own. Every run locks under a fresh path (--path plus a random
suffix) and deletes it at the end.
"""

import argparse
import json
import sys
import time
import uuid
from importlib.metadata import version

from handoffs import run_contended

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

KAZOO = version("kazoo")
WARMUP = 50
ACQUIRE_TIMEOUT = 30.0  # a stuck blocking acquire fails the run, not hangs it


def connect(hosts):
    client = KazooClient(hosts=hosts)
    client.start(timeout=10)
    return client


def close(client):
    client.stop()
    client.close()


def recipe(client, path, name):
    if name == "semaphore":
        return client.Semaphore(path, max_leases=3)
    if name == "read":
        return client.ReadLock(path)
    if name == "write":
        return client.WriteLock(path)
    return client.Lock(path)


def uncontended(client, path, iterations, name="lock"):
    lock = recipe(client, path, name)

    def pair():
        if not lock.acquire(blocking=False):
            raise RuntimeError("uncontended acquire(blocking=False) returned False")
        lock.release()

    for _ in range(WARMUP):
        pair()
    start = time.perf_counter()
    for _ in range(iterations):
        pair()
    seconds = time.perf_counter() - start
    return {
        "mode": "uncontended",
        "pairs": iterations,
        "seconds": round(seconds, 6),
        "pairs_per_s": round(iterations / seconds, 1),
        "recipe": name,
    }


def contended(clients, path, seconds):
    locks = [c.Lock(path, identifier=f"bench-{i}") for i, c in enumerate(clients)]
    return run_contended(locks, seconds, lambda lock: lock.acquire(timeout=ACQUIRE_TIMEOUT))



def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="127.0.0.1:2181")
    ap.add_argument("--path", default="/bench-kazoo",
                    help="lock path prefix; a random suffix is appended per run")
    ap.add_argument("--mode", choices=["uncontended", "contended"], required=True)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--recipe", choices=["lock", "semaphore", "read", "write"], default="lock")
    ap.add_argument("--contenders", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=5)
    args = ap.parse_args()
    if args.iterations < 1 or args.contenders < 1 or args.seconds <= 0:
        ap.error("--iterations and --contenders must be >= 1, --seconds > 0")

    path = f"{args.path.rstrip('/')}-{uuid.uuid4().hex[:12]}"
    n = 1 if args.mode == "uncontended" else args.contenders
    clients = []
    try:
        for _ in range(n):
            clients.append(connect(args.hosts))
        if args.mode == "uncontended":
            result = uncontended(clients[0], path, args.iterations, args.recipe)
        else:
            result = contended(clients, path, args.seconds)
    finally:
        try:
            if clients:
                clients[0].delete(path, recursive=True)
        except NoNodeError:
            pass
        except Exception as e:
            print(f"zk_kazoo: could not delete {path}: {e}", file=sys.stderr)
        for c in clients:
            close(c)
    result["kazoo"] = KAZOO
    print(json.dumps(result, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        print(f"zk_kazoo: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
