"""pylibmc (libmemcached) through the proxy: get_stats() answers with the
proxy's stats, and a set/get round trip works.

usage: pylibmc_stats.py HOST:PORT
"""
import sys

import pylibmc

addr = sys.argv[1]
mc = pylibmc.Client([addr], binary=False)
stats = mc.get_stats()
if len(stats) != 1 or "pid" not in stats[0][1]:
    sys.exit(f"get_stats(): {stats!r}")
mc.set("pylibmc:stats", b"1")
if mc.get("pylibmc:stats") != b"1":
    sys.exit("get after set")
print(f"pylibmc get_stats(): {len(stats[0][1])} fields")
