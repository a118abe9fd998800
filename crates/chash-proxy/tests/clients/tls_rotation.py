"""20 redis-py clients over TLS through the proxy for SECONDS, each on its
own connection made at the start, writing and reading back; prints the
requests made and the ones that failed (0 expected while the proxy's
certificate is replaced).

Usage: tls_rotation.py HOST:PORT CA_BUNDLE SECONDS
"""
import sys
import threading
import time

import redis


def main():
    at, ca, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    host, port = at.rsplit(":", 1)
    clients = [redis.Redis(host=host, port=int(port), ssl=True, ssl_ca_certs=ca, socket_timeout=5)
               for _ in range(20)]
    for c in clients:
        c.ping()  # connected (and shaken hands) before the rotation
    print("ready", flush=True)
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def run(i, c):
        n = 0
        while time.monotonic() < end:
            key = f"rot:{i}:{n % 50}"
            try:
                c.set(key, str(n))
                ok = c.get(key) == str(n).encode()
            except Exception as e:  # noqa: BLE001
                print(f"client {i}: {e!r}", flush=True)
                ok = False
            with lock:
                counts["ok" if ok else "failed"] += 1
            n += 1

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"requests {counts['ok'] + counts['failed']} failed {counts['failed']}", flush=True)


if __name__ == "__main__":
    main()
