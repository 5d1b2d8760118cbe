"""An ssh ProxyCommand that drops the connection: ``drop_proxy.py HOST PORT LIMIT``.

Relays bytes between ssh (stdin/stdout) and HOST:PORT, and after LIMIT bytes from the client closes both
sides at once, as a network failure would (the SSH session ends without a goodbye).
"""
import os
import select
import socket
import sys

host, port, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sock = socket.create_connection((host, port))
sent = 0
stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
while True:
    ready, _, _ = select.select([stdin, sock], [], [])
    if stdin in ready:
        data = os.read(stdin, 65536)
        if not data:
            break
        if sent + len(data) > limit:
            sock.sendall(data[:max(0, limit - sent)])
            break
        sock.sendall(data)
        sent += len(data)
    if sock in ready:
        data = sock.recv(65536)
        if not data:
            break
        os.write(stdout, data)
sock.shutdown(socket.SHUT_RDWR)
sock.close()
os._exit(0)
