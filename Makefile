# One command per job. Each target sets itself up first (scripts/bootstrap.sh).
.PHONY: test matrix docs docs-gen lint types demo bench bench-quick soak failover

VENV := .venv/bin
MINUTES ?= 10

test:  ## the whole suite: lint, types, layering, then pytest (newest versions), the nox version matrix and a 2-minute chaos soak
	@scripts/bootstrap.sh test,dev,demo
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	$(VENV)/mypy
	$(VENV)/lint-imports
	$(VENV)/mkdocs build --strict --quiet --site-dir build/site
	scripts/test_all.sh

matrix:  ## only the version matrix (nox sessions matrix(oldest) and matrix(middle))
	@scripts/bootstrap.sh test,dev
	$(VENV)/nox -s "matrix(oldest)" "matrix(middle)"

docs:  ## the documentation site (MkDocs, strict) in site/; docs-gen refreshes generated tables
	@scripts/bootstrap.sh test,dev
	$(VENV)/python scripts/gen_docs.py
	$(VENV)/mkdocs build --strict

docs-gen:
	@scripts/bootstrap.sh test,dev
	$(VENV)/python scripts/gen_docs.py

lint:
	@scripts/bootstrap.sh test,dev
	$(VENV)/ruff check . && $(VENV)/ruff format --check .

types:
	@scripts/bootstrap.sh test,dev
	$(VENV)/mypy

demo:  ## the flash-sale demo (REDIS_URL to use your Redis; else a private one is started)
	@scripts/bootstrap.sh demo
	$(VENV)/python -m examples.flash_sale.demo $(ARGS)

bench:  ## every published benchmark figure from one run (its duration: "Took" in docs/benchmarks.md): docs/benchmarks.md, README, docs/img/, docs/beat/
	@scripts/bootstrap.sh test,dev,bench
	$(VENV)/python -m benchmarks.run --write docs/benchmarks.md --readme README.md $(ARGS)
	$(VENV)/python -m benchmarks.beat_failover --minutes 4 --lease 3 --json docs/beat/failover.json
	$(VENV)/python scripts/gen_docs.py --no-samples  # the prose that reads the new tables

bench-quick:  ## a smoke run of every benchmark (one short repetition); prints the markdown, writes nothing
	@scripts/bootstrap.sh test,dev,bench
	$(VENV)/python -m benchmarks.run --quick $(ARGS)
	$(VENV)/python -m benchmarks.beat_failover --minutes 0.5 --lease 3

soak:  ## the chaos soak: real workers and beat under injected faults, MINUTES=10 (report: build/soak/)
	@scripts/bootstrap.sh test,dev
	$(VENV)/python -m benchmarks.soak --minutes $(MINUTES) --run-dir build/soak/logs \
		--json build/soak/report.json --markdown build/soak/report.md $(ARGS)

failover:  ## Sentinel failovers: how often exclusion breaks, with and without WAIT (replicas=1)
	@scripts/bootstrap.sh test,dev
	$(VENV)/python -m benchmarks.failover --json build/failover.json $(ARGS)
