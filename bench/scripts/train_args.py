"""What the elastic bench's training scripts share: their command line and the JSON-lines record writer."""
import argparse
import json
import os


def parser(*, batch: int, grad_accum: int, pg_timeout: float, dir_help: str) -> argparse.ArgumentParser:
    """The arguments every script takes (each script adds its own); the defaults are the script's."""
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True, help=dir_help)
    p.add_argument("--batch", type=int, default=batch, help="local batch when the launcher gives none")
    p.add_argument("--grad-accum", type=int, default=grad_accum, help="GA when the launcher gives none")
    p.add_argument("--pg-timeout", type=float, default=pg_timeout,
                   help="seconds before a collective with a silent peer fails")
    p.add_argument("--sleep", type=float, default=0.2, help="seconds of 'work' after each step")
    p.add_argument("--steps", type=int, default=5000, help="upper bound on steps")
    p.add_argument("--samples", type=int, default=480)
    p.add_argument("--marker", default="", help="ignored: names the run's processes for the controller")
    return p


def appender(directory: str):
    """append(name, record): one JSON line onto <directory>/<name>, written whole (O_APPEND)."""
    def append(name: str, record: dict) -> None:
        fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)
    return append
