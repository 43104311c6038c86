# One command per job. Each target sets itself up first (scripts/bootstrap.sh).
.PHONY: test matrix docs docs-gen lint types demo bench

VENV := .venv/bin

test:  ## the whole suite: lint, types, layering, then pytest (newest versions) and the nox version matrix
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

bench:  ## benchmarks against the libraries users would pick instead
	@scripts/bootstrap.sh test,dev,bench
	$(VENV)/python -m benchmarks.bench_lock
	$(VENV)/python -m benchmarks.bench_celery
