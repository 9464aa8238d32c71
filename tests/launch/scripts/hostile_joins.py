"""The other user against a run's join address (stdlib only: run as `nobody` with the system's python3).

``forge PORT VERSION LOG CODE WORKDIR``: hold the join port before copy 0 does, as a forged controller: to every
copy that connects, a challenge, ``ok`` with a made-up proof and a JoinArgs line that would run ``python -c CODE`` in
WORKDIR; everything the copies sent is appended to LOG. Prints ``listening`` once bound.

``crowd PORT RUN_ID CONNECTIONS WAVES``: first one join whose host name carries terminal escapes (clear the screen,
set the window title, a fake green line over the line shown) and one line that is no join, with escapes and a carriage
return, each verdict read; then WAVES waves of
CONNECTIONS connections opened at once, waited on (up to 5 s) and closed, printing ``wave N: M connected`` (how
many the listener's kernel took) before the close.
"""
import json
import select
import socket
import sys
import time

EVIL_HOST = "\x1b[2J\x1b]0;pwned\x07\x1b[2K\x1b[1G\x1b[32mpodrun:finished-ok\x1b[0m"   # no white space: one word
EVIL_LINE = "@podrun-join join \x1b[2J\r\x1b[32mpodrun: run finished: exit 0\x1b[0m"


def forge(port: int, version: int, log: str, code: str, workdir: str) -> None:
    srv = socket.create_server(("127.0.0.1", port))
    print("listening", flush=True)
    while True:
        conn, _ = srv.accept()
        with conn, open(log, "ab", buffering=0) as out:      # each write lands at once: the test kills this process when its run ends
            conn.sendall(f"@podrun-join challenge {version} {'ab' * 16}\n".encode())
            conn.settimeout(10)
            got = b""
            try:
                while b"\n" not in got:
                    data = conn.recv(4096)
                    if not data:
                        break
                    got += data
                out.write(got)
                args = {"argv": [sys.executable, "-c", code, "--"], "workdir": workdir, "mac": "0" * 64}
                conn.sendall(f"@podrun-join joined ok {'0' * 64}\n@podrun-join args {json.dumps(args)}\n".encode())
                while True:
                    data = conn.recv(4096)
                    if not data:
                        break
                    out.write(data)
            except OSError:
                pass


def crowd(port: int, run_id: str, count: int, waves: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.recv(4096)
        s.sendall(f"@podrun-join join {run_id} 1 {EVIL_HOST} 4242 {'0' * 64} {'cd' * 16} copy\n".encode())
        s.recv(4096)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.recv(4096)
        s.sendall(f"{EVIL_LINE}\n".encode())
        s.recv(4096)
    for wave in range(waves):
        held = []
        for _ in range(count):
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            except OSError:
                c.close()
                continue
            held.append(c)
        poll, connected = select.poll(), 0
        for c in held:
            poll.register(c, select.POLLOUT)
        deadline = time.monotonic() + 5
        waiting = {c.fileno() for c in held}
        while waiting and time.monotonic() < deadline:
            for fd, ev in poll.poll(100):
                poll.unregister(fd)
                waiting.discard(fd)
                connected += not ev & (select.POLLERR | select.POLLHUP)
        print(f"wave {wave}: {connected} connected", flush=True)
        for c in held:
            c.close()


if __name__ == "__main__":
    if sys.argv[1] == "forge":
        forge(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])
    else:
        crowd(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
