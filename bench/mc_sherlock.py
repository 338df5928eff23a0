"""Baseline for `lockwright-bench memcached`: Python sherlock's memcached lock.

Measures sherlock.MCLock (over pylibmc, binary protocol, as sherlock
configures it by default) against a live memcached server, plus pymemcache's
bare add/delete, in one of three modes, and prints exactly one JSON line on
stdout (errors go to stderr, with a nonzero exit status):

  uncontended  one client, one lock: N sequential acquire(blocking=False) +
               release pairs, timed after a 50-pair warm-up. sherlock takes
               with `add` (value a fresh uuid4) and gives back with `get`,
               a compare in Python, then a plain `delete`: three round trips.
  raw          pymemcache add(noreply=False) + delete(noreply=False) on one
               key, N pairs after the same warm-up: the naive, unsafe floor
               (no owner check on release).
  contended    C threads, each with its own pylibmc client (a pylibmc Client
               is not thread-safe) and its own MCLock on one key, loop
               blocking acquire / tiny critical section / release for T
               seconds. sherlock blocks by polling: `add`, then sleep
               retry_interval (set to RETRY_INTERVAL, far below its 0.1 s
               default). Hand-off latency runs from one client's release
               start to the next grant to a different client, the same
               measure as cli-kit/src/timing.rs.

`lockwright-bench memcached` runs this as a subprocess and prints its figures
beside its own. Every run locks under a fresh key (--key plus a random
suffix) and deletes it at the end.
"""

import argparse
import json
import sys
import time
import uuid
from importlib.metadata import version

from handoffs import run_contended

import pylibmc
from pymemcache.client.base import Client as PymemcacheClient
from sherlock import MCLock

SHERLOCK = version("sherlock")
PYLIBMC = version("pylibmc")
PYMEMCACHE = version("pymemcache")
WARMUP = 50
EXPIRE = 30  # seconds; no run holds the key anywhere near that long
RETRY_INTERVAL = 0.001  # sherlock's sleep between failed adds when blocking
# A stuck blocking acquire fails the run, not hangs it. sherlock counts this
# budget down by retry_interval per failed add (not by elapsed time), so it
# allows ACQUIRE_TIMEOUT / RETRY_INTERVAL retries: at least this long.
ACQUIRE_TIMEOUT = 30.0


def host_port(server):
    host, sep, port = server.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--server must be HOST:PORT, not {server!r}")
    return host, int(port)


def connect(server):
    """A pylibmc client configured as sherlock's own default (binary=True)."""
    return pylibmc.Client([server], binary=True)


def close(client):
    client.disconnect_all()


def pairs_result(mode, iterations, seconds):
    return {
        "mode": mode,
        "pairs": iterations,
        "seconds": round(seconds, 6),
        "pairs_per_s": round(iterations / seconds, 1),
    }


def timed_pairs(pair, iterations):
    for _ in range(WARMUP):
        pair()
    start = time.perf_counter()
    for _ in range(iterations):
        pair()
    return time.perf_counter() - start


def uncontended(client, key, iterations):
    lock = MCLock(key, client=client, expire=EXPIRE)

    def pair():
        if lock.acquire(blocking=False) is not True:
            raise RuntimeError("uncontended acquire(blocking=False) returned False")
        lock.release()

    seconds = timed_pairs(pair, iterations)
    result = pairs_result("uncontended", iterations, seconds)
    result["sherlock"] = SHERLOCK
    result["pylibmc"] = PYLIBMC
    return result


def raw(client, key, iterations):
    owner = uuid.uuid4().hex

    def pair():
        if client.add(key, owner, expire=EXPIRE, noreply=False) is not True:
            raise RuntimeError("uncontended add returned False")
        client.delete(key, noreply=False)

    seconds = timed_pairs(pair, iterations)
    result = pairs_result("raw", iterations, seconds)
    result["pymemcache"] = PYMEMCACHE
    return result


def contended(clients, key, seconds):
    locks = [
        MCLock(key, client=c, expire=EXPIRE, timeout=ACQUIRE_TIMEOUT,
               retry_interval=RETRY_INTERVAL)
        for c in clients
    ]
    # Blocking acquire raises LockTimeoutException after ACQUIRE_TIMEOUT.
    result = run_contended(locks, seconds, lambda lock: lock.acquire(blocking=True))
    result["retry_interval"] = RETRY_INTERVAL
    result["sherlock"] = SHERLOCK
    result["pylibmc"] = PYLIBMC
    return result



def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="127.0.0.1:11211")
    ap.add_argument("--key", default="bench-sherlock",
                    help="lock key prefix; a random suffix is appended per run")
    ap.add_argument("--mode", choices=["uncontended", "raw", "contended"],
                    required=True)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--contenders", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=5)
    args = ap.parse_args()
    if args.iterations < 1 or args.contenders < 1 or args.seconds <= 0:
        ap.error("--iterations and --contenders must be >= 1, --seconds > 0")
    try:
        host, port = host_port(args.server)
    except ValueError as e:
        ap.error(str(e))

    key = f"{args.key}-{uuid.uuid4().hex[:12]}"
    clients = []
    try:
        if args.mode == "raw":
            clients.append(PymemcacheClient((host, port), connect_timeout=10,
                                            timeout=10))
            result = raw(clients[0], key, args.iterations)
        else:
            n = 1 if args.mode == "uncontended" else args.contenders
            for _ in range(n):
                clients.append(connect(args.server))
            if args.mode == "uncontended":
                result = uncontended(clients[0], key, args.iterations)
            else:
                result = contended(clients, key, args.seconds)
    finally:
        try:
            if clients and isinstance(clients[0], PymemcacheClient):
                clients[0].delete(key, noreply=False)
            elif clients:
                clients[0].delete(key)
        except Exception as e:
            print(f"mc_sherlock: could not delete {key}: {e}", file=sys.stderr)
        for c in clients:
            if isinstance(c, PymemcacheClient):
                c.close()
            else:
                close(c)
    print(json.dumps(result, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        print(f"mc_sherlock: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
