"""The second local user of the security tests: `nobody` (uid/gid 65534, no groups), reached with setpriv, as an
ordinary account on a shared login or compute node would be. A test that needs it and cannot have it (not root, no
setpriv) fails and says so; it never skips."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

NOBODY = 65534
AS_NOBODY = ("setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups")


def require_second_user() -> None:
    """Fail (not skip) when this machine cannot act as the second user."""
    missing = [what for what, ok in (("root (to switch users)", os.geteuid() == 0),
                                     ("setpriv (util-linux)", shutil.which("setpriv") is not None)) if not ok]
    if missing:
        pytest.fail("the security tests act as a second local user and need " + " and ".join(missing))


def as_nobody(script: str, *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a shell script as the other user, umask 0 as a careless or hostile one."""
    require_second_user()
    cp = subprocess.run([*AS_NOBODY, "sh", "-c", f"umask 0; {script}"], capture_output=True, text=True,
                        timeout=timeout)
    if check:
        assert cp.returncode == 0, cp.stderr
    return cp


def popen_as_nobody(argv, **kw) -> subprocess.Popen:
    require_second_user()
    return subprocess.Popen([*AS_NOBODY, *argv], **kw)


@pytest.fixture
def shared():
    """A directory both users may create in, as /tmp is (1777), outside pytest's private tmp_path."""
    d = Path(tempfile.mkdtemp(prefix="podrun-shared-", dir="/tmp"))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
