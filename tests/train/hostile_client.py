"""Hostile HTTP clients, run as their own process (a client in the server's process would compete with it for
the GIL and measure that instead):

    python hostile_client.py stall URL N     N connections that each send part of a request head and stall;
                                             prints "stalled" once all are open, holds them until stdin closes
    python hostile_client.py flood URL N KEY N session opens pipelined on one connection (two per group);
                                             prints the JSON count of each answer's status
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from collections import Counter


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def stall(url: str, count: int) -> None:
    held = []
    for _ in range(count):
        sock = socket.create_connection(address(url))
        sock.sendall(b"POST /sessions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n")  # no end
        held.append(sock)
    print("stalled", flush=True)
    sys.stdin.read()
    for sock in held:
        sock.close()


def flood(url: str, count: int, key: str) -> None:
    with socket.create_connection(address(url)) as sock:
        answers: list[bytes] = []
        reader = threading.Thread(target=lambda: answers.extend(iter(lambda: sock.recv(1 << 16), b"")))
        reader.start()
        for i in range(count):
            body = b'{"group": "flood-%d", "metadata": {"k": "v"}}' % (i // 2)
            sock.sendall(b"POST /sessions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer " + key.encode()
                         + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n")
        reader.join()
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", b"".join(answers))  # bodies run into the next status line
    print(json.dumps(Counter(status.decode() for status in statuses)))


if __name__ == "__main__":
    command, url, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stall(url, count) if command == "stall" else flood(url, count, sys.argv[4])
