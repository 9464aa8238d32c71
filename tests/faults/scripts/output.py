"""A worker that writes MB megabytes on stdout (as 1 KiB lines, or as one line without a newline), then a
line "output-end", touches DONE (if given), and waits until the file GO exists (so its launcher's peak
memory can be read while every process is still alive).

    python output.py MB lines|oneline GO [DONE]
"""
import os
import sys
import time

mb, mode, go = int(sys.argv[1]), sys.argv[2], sys.argv[3]
chunk = (b"x" * 1023 + b"\n") * 1024 if mode == "lines" else b"y" * (1 << 20)
out = sys.stdout.buffer
for _ in range(mb):
    out.write(chunk)
out.write(b"\noutput-end\n")
out.flush()
if len(sys.argv) > 4:
    open(sys.argv[4], "w").close()
while not os.path.exists(go):
    time.sleep(0.05)
