"""`python -m bench` runs bench/run.py."""
import sys

from bench.run import main

sys.exit(main())
