# Shortcuts; CI runs .ci/run (install + the README's test command).
.PHONY: install test bench bench-quick

install:
	bash .ci/install

test:
	python3 -m pytest -q

# every benchmark, full size (minutes); figures go to bench/out/*.json and bench/RESULTS.md by hand
bench:
	python3 -m bench

# the same in seconds
bench-quick:
	python3 -m bench --quick
