"""pylibmc's get_multi of 150 and of 300 values of 1 MB through the proxy,
TRIES times each: every value, every time. The values were stored as
big:<i> = "<i:07>|" repeated to 1,000,000 bytes (proxy_memory.rs).

usage: large_get_multi.py HOST:PORT TRIES
"""
import sys

import pylibmc


def value(i):
    stamp = f"{i:07}|".encode()
    return (stamp * (1_000_000 // len(stamp) + 1))[:1_000_000]


def main():
    addr, tries = sys.argv[1], int(sys.argv[2])
    mc = pylibmc.Client([addr], binary=False)
    expect = {f"big:{i}": value(i) for i in range(300)}
    for n in (150, 300):
        keys = [f"big:{i}" for i in range(n)]
        for attempt in range(tries):
            got = mc.get_multi(keys)
            missing = [k for k in keys if k not in got]
            wrong = [k for k in keys if k in got and got[k] != expect[k]]
            if missing or wrong:
                sys.exit(f"{n} values, try {attempt}: {len(missing)} missing, {len(wrong)} wrong")
    print(f"pylibmc get_multi: 150 and 300 values of 1 MB, {tries} tries each, every value every time")


main()
