# Shortcuts; CI runs .ci/run (install + the README's test command).
.PHONY: install test bench bench-quick

install:
	bash .ci/install

test:
	python3 -m pytest -q

# every benchmark, full size (minutes); the JSON goes to bench/out/ and, kept, to bench/results/ (the file a
# table in bench/RESULTS.md names)
bench:
	python3 -m bench --keep

# the same in seconds
bench-quick:
	python3 -m bench --quick
