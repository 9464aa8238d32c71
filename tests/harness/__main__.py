"""`python -m tests.harness cleanup`: remove namespaces, bridges and daemons left by killed sessions."""
import sys

from . import cleanup_stale

if __name__ == "__main__":
    if sys.argv[1:] != ["cleanup"]:
        print("usage: python -m tests.harness cleanup", file=sys.stderr)
        sys.exit(2)
    cleanup_stale()
    print("podrun test harness: free slots cleaned; slots of live sessions left alone")
