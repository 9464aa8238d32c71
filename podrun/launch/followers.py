"""The workers that ended after a run's root cause (its followers), summarised by exit code with their ranks as ranges."""
from __future__ import annotations


from podrun.launch.outcome import exit_signal
from podrun.launch.stacks import rank_ranges


def summarise(ended: list[tuple[int, str, int]]) -> dict | None:
    """(rank, host, exit code) of every other worker that ended non-zero -> {"count", "hosts", "by_code":
    [{"exit_code", "ranks"}]} (the codes most common first), or None when there is none."""
    if not ended:
        return None
    by: dict[int, list[int]] = {}
    for rank, _, code in ended:
        by.setdefault(code, []).append(rank)
    return {"count": len(ended), "hosts": len({h for _, h, _ in ended}),
            "by_code": [{"exit_code": c, "ranks": sorted(r)}
                        for c, r in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0]))]}


def describe_code(code: int) -> str:
    """143 -> "exit 143 (SIGTERM)"; 1 -> "exit 1"."""
    sig = exit_signal(code)
    return f"exit {code} ({sig})" if sig is not None else f"exit {code}"


SHOWN_RANGES = 8           # ranges of one exit code shown on the console (summary.json has every rank)


def ranges(ranks: list[int]) -> str:
    """"0-38, 40-63" (at most SHOWN_RANGES ranges, then how many more ranks)."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    shown = runs[:SHOWN_RANGES]
    text = ", ".join(rank_ranges(run) for run in shown)
    more = len(ranks) - sum(len(run) for run in shown)
    return text + (f" and {more} more" if more > 0 else "")


def line(followers: dict) -> str:
    """One line whatever the number of ranks: "then 255 other ranks on 4 hosts ended: exit 1 (ranks 0-38, 40-199),
    exit 143 (SIGTERM) (ranks 200-255)"."""
    n, hosts = followers["count"], followers["hosts"]
    parts = [f"{describe_code(g['exit_code'])} ({'rank' if len(g['ranks']) == 1 else 'ranks'} "
             f"{ranges(g['ranks'])})" for g in followers["by_code"]]
    return (f"then {n} other rank{'s' if n != 1 else ''} on {hosts} host{'s' if hosts != 1 else ''} ended: "
            + ", ".join(parts))
