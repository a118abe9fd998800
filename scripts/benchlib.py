"""Helpers shared by scripts/bench-proxy and scripts/bench-proxy-redis."""
import os
import socket
import subprocess
import time


# Rust's allocator entry points, as symbols (perf) and function names
# (callgrind) show them: allocation, whichever profiler counts it.
RUST_ALLOCATOR = ("__rust_alloc", "__rust_dealloc", "__rust_realloc", "__rdl_")


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=10):
    """Waits until something accepts connections on 127.0.0.1:port."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def cpu_ns(pid):
    """CPU time (user + system) of all of a process's threads so far, in ns."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # a thread that just ended
    return total


def add_proxy_arguments(ap):
    """The options that choose which chash proxies run beside nutcracker."""
    ap.add_argument("--chash-args", default="", help="extra arguments for chash proxy, e.g. '--threads 2'")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                    help="also run another chash proxy with these arguments, e.g. 'chash-t2=--threads 2'; "
                         "ARGS starting with @PATH run the chash binary at PATH (another build)")


def variants(args):
    """{name: extra arguments} of the chash proxies to run."""
    out = {"chash-proxy": args.chash_args}
    for v in args.variant:
        name, _, extra = v.partition("=")
        out[name] = extra
    return out


def build_floor(dest, debug=False, uring=False):
    """Builds scripts/floor-proxy.c (the reference forwarder) at `dest`: its
    io_uring variant with `uring` (True: reads and writes batched; "sends":
    writes only); returns `dest`."""
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor-proxy.c")
    flags = {False: [], True: ["-DURING"], "sends": ["-DURING_SENDS"]}[uring]
    subprocess.run([os.environ.get("CC", "cc"), "-O2"] + (["-g"] if debug else []) + flags + ["-o", dest, source],
                   check=True)
    return dest


def start_chash(chash, config, extra, fixed_args):
    """Starts `chash proxy -c config` (or another build: extra = '@PATH ARGS')."""
    binary = chash
    if extra.startswith("@"):
        binary, _, extra = extra[1:].partition(" ")
    # The stats port on a free loopback port, as nutcracker gets one.
    return subprocess.Popen([binary, "proxy", "-c", config, "--no-admin", "-s", "0", "-a", "127.0.0.1", "-v", "3"]
                            + fixed_args + extra.split(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
