"""The bounds every number and name entering podrun is checked against (CLI options and spec loader alike)."""
from __future__ import annotations

# Hosts in one plan. The largest machines have a few tens of thousands of nodes; a list longer
# than this is a typo (g[1-100000000], count: 10**9) and would only exhaust memory.
MAX_HOSTS = 100_000

# Devices (and instances) on one host. A DGX has 8, an IPU-POD host 4 to 16, a CPU host its cores.
MAX_PER_HOST = 4096

# Samples per weight update, per replica and micro step, and micro steps per update. The largest
# published data-parallel batches are around 10**5 samples; 2**24 leaves room and stays far from
# integer overflow in the frameworks' step counters.
MAX_BATCH = 2 ** 24

# Integers in a spec or recipe (parameter counts, dataset sizes): exact in a float64 (2**53).
MAX_SPEC_INT = 2 ** 53

# A spec or recipe file larger than this is not one (they are a few KiB).
MAX_SPEC_BYTES = 1024 * 1024

# YAML structure: nesting depth and the number of nodes after aliases are expanded (bounds
# alias/anchor bombs such as `b: &b [*a, *a, ...]` nine levels deep).
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 200_000

# Restarts of a whole run, and seconds for any duration option (a day is more than any grace).
MAX_RESTARTS = 1000
MAX_SECONDS = 7 * 24 * 3600.0

# The shortest hang window (--hang-timeout, hang_timeout in a spec or recipe): a shorter one ends a healthy
# run as hung between two of its lines.
MIN_HANG_S = 1.0
