"""Reading a user's text file within bounds: a regular file only, at most a size limit, UTF-8, errors naming the
file and line."""
from __future__ import annotations

from pathlib import Path

from podrun.errors import PodrunError
from podrun.safefs import read_user_file


class _TooLarge(PodrunError):
    """read_user_file's refusal of a file over the limit, said again in the caller's words."""


def read_bounded_text(path: str | Path, *, what: str, limit: int, error: type[PodrunError],
                      too_big: str, not_utf8_hint: str) -> str:
    """The text of ``path``, read once and never more than ``limit`` bytes (podrun.safefs.read_user_file: a FIFO
    or a device is refused at once, never waited on or read without end).

    Every refusal is an ``error`` whose message starts with ``what`` (how the caller names the file):
    unreadable (with the OS reason), not a regular file, larger than ``limit`` (followed by ``too_big``, saying
    why that is not the kind of file asked for), or not UTF-8 (line and byte offset of the first bad byte).
    """
    try:
        data = read_user_file(path, what, limit=limit, error=error, too_large=_TooLarge, label=what)
    except _TooLarge:
        size = f"{limit // (1024 * 1024)} MiB" if limit % (1024 * 1024) == 0 else f"{limit // 1024} KiB"
        raise error(f"{what}: larger than {size}; {too_big}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(f"{what}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                    hint=not_utf8_hint) from None
