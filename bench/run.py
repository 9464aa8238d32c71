"""One entry point for the benchmarks: `python -m bench [--quick] [NAME ...]`; prints tables, writes JSON.

`python -m bench mutate [--modules ...] [--per-module N] [--seed S]` is the mutation check of the defences, with
options of its own (bench/bench_mutate.py; not part of the default run)."""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import pkgutil
import sys
import time
from pathlib import Path

from bench.rows import print_table

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"      # the JSON behind bench/RESULTS.md's figures (--keep)
sys.path.insert(0, str(HERE.parent))     # `tests.harness` for the benchmarks that need real hosts


OWN_OPTIONS = {"mutate"}    # `python -m bench mutate [its options]` (bench/bench_mutate.py); not in the default run


def available() -> list[str]:
    return sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([str(HERE)]) if m.name.startswith("bench_"))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["mutate"]:
        from bench import bench_mutate
        return bench_mutate.main(argv[1:])
    if argv[:1] == ["gpu-check"]:      # python -m bench gpu-check OUT_DIR [--cpu] (docs/gpu-check.md)
        from bench import gpu_check
        return gpu_check.main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default all): {', '.join(available())}")
    ap.add_argument("--quick", action="store_true", help="few repeats, small sizes (seconds; used in CI)")
    ap.add_argument("--out", default=str(HERE / "out"), help="folder for the JSON results")
    ap.add_argument("--keep", action="store_true",
                    help="also write the JSON to bench/results/NAME-YYYYMMDD-HHMM.json, the file a figure in "
                         "bench/RESULTS.md names (committed; tests/bench/test_bench_results.py checks the figures)")
    args = ap.parse_args(argv)
    names = [n.replace("-", "_") for n in args.names] or [n for n in available() if n not in OWN_OPTIONS]
    unknown = sorted(set(names) - set(available()))
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(available())}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        mod = importlib.import_module(f"bench.bench_{name}")
        t0 = time.time()
        try:
            rows = mod.run(quick=args.quick)
        except Exception as exc:  # one benchmark failing must not hide the others
            print(f"[{name}] failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"\n== {name} ({time.time() - t0:.1f} s{', quick' if args.quick else ''})")
        print_table(rows)
        record = {"benchmark": name, "quick": args.quick, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "machine": f"{platform.node()} {platform.machine()} {platform.python_version()}",
                  "command": "python -m bench " + ("--quick " if args.quick else "") + name, "rows": rows}
        (out / f"{name}.json").write_text(json.dumps(record, indent=2))
        if args.keep:
            RESULTS.mkdir(exist_ok=True)
            kept = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M', time.gmtime())}.json"
            kept.write_text(json.dumps(record, indent=1) + "\n")
            print(f"kept: {kept.relative_to(HERE.parent)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
