"""An ssh ProxyCommand that stalls the link: ``stall_proxy.py HOST PORT --after BYTES [--link FILE]
[--linger S]``.

Relays bytes between ssh (stdin/stdout) and HOST:PORT until BYTES came from the client, then relays nothing
more in either direction while keeping both sides open, as a black-holed network path does: no FIN, no
RST, no bytes. With ``--link FILE`` all connections share one link: the first to stall creates FILE, and
every other connection stalls as soon as FILE exists (checked every 0.1 s); a connection opened when FILE
already exists is closed at once (ssh fails fast instead of waiting for its ConnectTimeout). The proxy
ignores the SIGHUP ssh sends it when it gives up, and exits S seconds (default 60) after its stall began.
"""
import argparse
import os
import select
import signal
import socket
import sys
import time

signal.signal(signal.SIGHUP, signal.SIG_IGN)        # ssh hangs up its proxy when it gives up: a dead path stays
p = argparse.ArgumentParser()
p.add_argument("host")
p.add_argument("port", type=int)
p.add_argument("--after", type=int, required=True)
p.add_argument("--link", default=None)
p.add_argument("--linger", type=float, default=60.0)
args = p.parse_args()
if args.link and os.path.exists(args.link):
    os._exit(1)
sock = socket.create_connection((args.host, args.port))
sent = 0
stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
while sent < args.after and not (args.link and os.path.exists(args.link)):
    ready, _, _ = select.select([stdin, sock], [], [], 0.1)
    if stdin in ready:
        data = os.read(stdin, 65536)[:args.after - sent]
        if not data:
            os._exit(0)
        sock.sendall(data)
        sent += len(data)
    if sock in ready:
        data = sock.recv(65536)
        if not data:
            os._exit(0)
        os.write(stdout, data)
if args.link:
    open(args.link, "a").close()
time.sleep(args.linger)         # the stall: both sockets stay open, nothing moves
os._exit(0)
