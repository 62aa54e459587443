#!/usr/bin/env python3
"""NOTIFY delivery latency on a busy server: one connection LISTENs, another
sends pg_notify with the sender's clock in the payload every 20 ms; prints
the p50/p99/max delay from the sender's call to the listener's receipt.

Speaks the Postgres wire protocol itself (trust auth only), so it needs no
driver: python3 notify_latency.py [seconds] [host] [port] [user] [db]
"""
import socket
import struct
import sys
import time

CHANNEL = "warden_bench_probe"


def connect(host, port, user, db):
    s = socket.create_connection((host, port))
    params = b"user\0" + user.encode() + b"\0database\0" + db.encode() + b"\0\0"
    body = struct.pack("!I", 196608) + params
    s.sendall(struct.pack("!I", len(body) + 4) + body)
    while True:
        kind, payload = read(s)
        if kind == b"E":
            raise SystemExit(payload)
        if kind == b"Z":
            return s


def read(s):
    head = recv(s, 5)
    kind, size = head[:1], struct.unpack("!I", head[1:])[0]
    return kind, recv(s, size - 4)


def recv(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise SystemExit("connection closed")
        buf += chunk
    return buf


def query(s, sql):
    body = sql.encode() + b"\0"
    s.sendall(b"Q" + struct.pack("!I", len(body) + 4) + body)


def main():
    args = sys.argv[1:]
    seconds = float(args[0]) if args else 30
    host = args[1] if len(args) > 1 else "127.0.0.1"
    port = int(args[2]) if len(args) > 2 else 5432
    user = args[3] if len(args) > 3 else "postgres"
    db = args[4] if len(args) > 4 else "postgres"
    listener = connect(host, port, user, db)
    query(listener, f"LISTEN {CHANNEL}")
    while read(listener)[0] != b"Z":
        pass
    sender = connect(host, port, user, db)
    delays = []
    end = time.time() + seconds
    while time.time() < end:
        sent = time.time()
        query(sender, f"SELECT pg_notify('{CHANNEL}', '{sent!r}')")
        while read(sender)[0] != b"Z":
            pass
        while True:
            kind, payload = read(listener)
            if kind == b"A":
                got = time.time()
                text = payload[4:].split(b"\0")
                delays.append(got - float(text[1].decode()))
                break
        time.sleep(0.02)
    delays.sort()
    q = lambda p: delays[min(len(delays) - 1, int(p * len(delays)))] * 1000
    print(f"notify delivery over {len(delays)} notes: p50 {q(0.5):.2f} ms, "
          f"p99 {q(0.99):.2f} ms, max {delays[-1] * 1000:.2f} ms")


if __name__ == "__main__":
    main()
