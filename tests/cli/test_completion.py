"""Completion in a real bash and zsh: podrun's completion script sourced as a user's shell sources
it, the shell's own completion function run on COMP_WORDS/COMP_CWORD (bash) or on a typed line (zsh), the candidates
read back from the shell: commands, options, cluster names, recipe names beside paths, a recipe's own options."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from podrun.specs import recipe_names

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "resnet18_cifar10"


@pytest.fixture
def shell_dir(tmp_path):
    """A working directory with files starting like the recipes (res*), and `podrun` on PATH (this checkout)."""
    (tmp_path / "bin").mkdir()
    program = tmp_path / "bin" / "podrun"
    program.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec {shlex.quote(sys.executable)} "
                       "-m podrun \"$@\"\n")
    program.chmod(0o755)
    work = tmp_path / "work"
    (work / "resdir").mkdir(parents=True)
    (work / "resdir" / "train.py").write_text("")
    (work / "res_notes.txt").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PODRUN_", "_PODRUN", "PYTHONPATH"))}
    return work, {**env, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{env.get('PATH', '')}"}


CASES = (   # the words typed (the last being completed), and the candidates the shell must offer
    (("podrun", "la"), {"launch"}),
    (("podrun", "launch", "--max-re"), {"--max-restarts"}),
    (("podrun", "launch", "--cluster", "ab"), {"abci", "abci3"}),
    (("podrun", "plan", "res"), {*(n for n in recipe_names() if n.startswith("res")), "res_notes.txt", "resdir"}),
    (("podrun", "launch", "--nodes", "1", "res"), {*(n for n in recipe_names() if n.startswith("res")),
                                                    "res_notes.txt", "resdir"}),
    (("podrun", "launch", "resdir/"), {"resdir/train.py"}),
    (("podrun", "launch", str(RECIPE), "--da"), {"--data"}),
    (("podrun", "launch", str(RECIPE), "--data", "res"), {"res_notes.txt", "resdir"}),
)


def test_bash_completes_commands_options_clusters_recipes_paths_and_a_recipes_own_options(shell_dir):
    work, env = shell_dir
    lines = ['source <(_PODRUN_COMPLETE=bash_source podrun) || exit 3',
             'comp() { COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMPREPLY=(); _podrun_completion podrun;'
             ' printf "== %s\\n" "$*"; printf "%s\\n" "${COMPREPLY[@]}"; }']
    lines += ["comp " + shlex.join(words) for words, _ in CASES]
    cp = subprocess.run(["bash", "--norc", "--noprofile", "-c", "\n".join(lines)], cwd=work, env=env,
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    got = {}
    for block in cp.stdout.split("== ")[1:]:
        said, *candidates = block.splitlines()
        got[said] = {c for c in candidates if c}
    for words, want in CASES:
        assert got.get(" ".join(words)) == want, (words, got.get(" ".join(words)), cp.stderr)


def _zsh_complete(env: dict, work: Path, lines: list[str]) -> list[str]:
    """Each of ``lines`` typed into an interactive zsh (compinit, podrun's script sourced) and Tab pressed; the
    screen's text after each Tab (the completed line and the list shown), up to a marker echoed after it."""
    import pty
    import re
    import select

    pid, fd = pty.fork()
    if pid == 0:                                                   # the child: an interactive zsh on the pty
        os.chdir(work)
        os.execvpe("zsh", ["zsh", "-f", "-i"], {**env, "TERM": "dumb"})

    seen = bytearray()

    def until(marker: bytes, start: int) -> int:
        """Read until ``marker`` shows at or after ``start``; where it ends."""
        while seen.find(marker, start) < 0:
            ready, _, _ = select.select([fd], [], [], 60)
            assert ready, f"zsh said nothing for 60 s; so far: {bytes(seen[start:])!r}"
            seen.extend(os.read(fd, 65536))
        return seen.find(marker, start) + len(marker)

    def prompt_after(marker: bytes, start: int) -> int:
        """Past ``marker`` and the prompt after it: zsh's line editor reads what is typed from then on (typed
        sooner, the terminal itself would take the Tab and Ctrl-U)."""
        return until(b"% ", until(marker + b"\r\n", start))

    try:
        os.write(fd, b"PS1='%% '; autoload -U compinit; compinit -u; setopt autolist nolistambiguous; "
                     b"eval \"$(_PODRUN_COMPLETE=zsh_source podrun)\"; echo READY$((1+1))\n")
        at = prompt_after(b"READY2", 0)
        screens = []
        for n, line in enumerate(lines):
            # Tab, then (typed ahead, read once the completion is done) the line cleared and a marker echoed
            os.write(fd, line.encode() + b"\t\x15echo DONE$((" + str(n).encode() + b"+1000))\n")
            end = prompt_after(f"DONE{n + 1000}".encode(), at)
            screens.append(re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]|[\x07\r]", "", seen[at:end].decode(errors="replace")))
            at = end
        return screens
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)


def test_zsh_completes_the_same(shell_dir):
    if shutil.which("zsh") is None:
        pytest.fail("zsh is not installed (Debian's zsh; .ci/install installs it)", pytrace=False)
    work, env = shell_dir
    screens = _zsh_complete(env, work, [shlex.join(words) for words, _ in CASES])
    for (words, want), screen in zip(CASES, screens):
        shown = set(screen.split()) | {w.rstrip("/") for w in screen.split()}
        assert want <= shown, (words, want - shown, screen)
        assert "--data-interface" not in screen or words[-1] != "--da", screen
