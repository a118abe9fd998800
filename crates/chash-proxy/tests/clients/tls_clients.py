"""Python clients over TLS through the proxy: pymemcache with an ssl context
to a memcached pool, or redis-py with ssl=True to a Redis pool; what they
write reads back, and a plaintext client of the same pool sees it.

Usage: tls_clients.py memcached|redis TLS_HOST:PORT PLAIN_HOST:PORT CA_FILE [CERT KEY]
"""
import socket
import ssl
import sys


def main():
    kind, tls_at, plain_at, ca = sys.argv[1:5]
    cert = sys.argv[5:7]
    host, port = tls_at.rsplit(":", 1)
    phost, pport = plain_at.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert[0], cert[1])
    if kind == "memcached":
        from pymemcache.client.base import Client
        c = Client((host, int(port)), tls_context=ctx, connect_timeout=5, timeout=5)
        for i in range(50):
            assert c.set(f"tls:{i}", f"value {i}".encode()), i
        got = c.get_many([f"tls:{i}" for i in range(50)])
        assert got == {f"tls:{i}": f"value {i}".encode() for i in range(50)}, got
        plain = Client((phost, int(pport)), connect_timeout=5, timeout=5)
        assert plain.get("tls:7") == b"value 7"
    else:
        import redis
        kwargs = {"ssl_certfile": cert[0], "ssl_keyfile": cert[1]} if cert else {}
        r = redis.Redis(host=host, port=int(port), ssl=True, ssl_ca_certs=ca, socket_timeout=5, **kwargs)
        for i in range(50):
            assert r.set(f"tls:{i}", f"value {i}")
        assert r.mget([f"tls:{i}" for i in range(50)]) == [f"value {i}".encode() for i in range(50)]
        plain = redis.Redis(host=phost, port=int(pport), socket_timeout=5)
        assert plain.get("tls:7") == b"value 7"
    print("ok")


if __name__ == "__main__":
    main()
