# Shortcuts; CI runs .ci/run (install + the README's test command).
.PHONY: install test bench bench-quick mutate

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

# the mutation check of the defences (cosmic-ray, `pip install -e '.[mutate]'`; not part of .ci/run): a sample of
# mutants per module against its fast tests, in a copy of the tree; the JSON goes to bench/results/
# (e.g. make mutate MUTATE="--per-module 5 --modules envchannel,hangs")
MUTATE ?= --per-module 20 --seed 1
mutate:
	python3 -m bench mutate --keep $(MUTATE)
