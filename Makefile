# One command to set up and run the job, one to set up and run every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DJANGO_DEBUG ?= 1

.PHONY: model setup run test test-sqlite test-postgres faults-table soak soak-table soak-failover-table lint demo clean bench requirements

# Two stamps: running the product installs the runtime only (requirements.txt);
# lint, tests and benchmarks install the development tools too (requirements-dev.txt).
# Both files pin every package, transitive ones included, with hashes: pip refuses
# anything else (docs/security.md, "Dependencies").
PIP_INSTALL := $(BIN)/pip install --disable-pip-version-check -q --require-hashes

$(BIN)/.installed: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -r requirements.txt
	touch $@

$(BIN)/.installed-dev: requirements-dev.txt requirements.txt $(BIN)/.installed
	$(PIP_INSTALL) -r requirements-dev.txt
	touch $@

# Recompile both pinned files from requirements.in / requirements-dev.in (the latest
# versions the .in files allow are taken only with UPGRADE=--upgrade, or
# UPGRADE='--upgrade-package NAME' for one package).
PIP_COMPILE := CUSTOM_COMPILE_COMMAND="make requirements" $(BIN)/pip-compile -q --generate-hashes \
	--allow-unsafe --strip-extras --no-emit-index-url --no-emit-trusted-host --no-emit-find-links $(UPGRADE)

requirements: $(BIN)/.installed-dev
	$(PIP_COMPILE) --output-file requirements.txt requirements.in
	$(PIP_COMPILE) --output-file requirements-dev.txt requirements-dev.in

setup: $(BIN)/.installed
	$(BIN)/python manage.py migrate --noinput -v 0

run: setup
	$(BIN)/python manage.py sync_contests

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The whole suite twice, at the same time (one core each): on the SQLite default and on a
# throwaway PostgreSQL cluster. Each time two runs: the project's own tests, then tests/locks
# under a project that installs only the locks app (tests/hostproject/settings.py). The two
# share nothing: their own databases and temporary directories, the crontab tests one at a
# time (a lock file). Each one's output is printed when it ends.
PYTEST := $(BIN)/python -m pytest
HOST := --ds tests.hostproject.settings

test: lint
	$(MAKE) --no-print-directory -j2 --output-sync=target test-sqlite test-postgres

test-sqlite: $(BIN)/.installed-dev
	env -u DATABASE_URL $(PYTEST)
	env -u DATABASE_URL $(PYTEST) $(HOST)

test-postgres: $(BIN)/.installed-dev
	scripts/with-postgres.sh sh -c '$(PYTEST) && $(PYTEST) $(HOST)'

# The model of the lease (docs/architecture.md, "The invariants the model checks") for MINUTES
# minutes on random seeds, each printed (MODEL_SEED=S replays one), on SQLite and on PostgreSQL at
# the same time; make test runs it on a fixed budget.
MINUTES ?= 30
MODEL := $(PYTEST) $(HOST) tests/locks/test_model.py -p no:cacheprovider --timeout 0 -s
model: $(BIN)/.installed-dev
	$(MAKE) --no-print-directory -j2 --output-sync=target model-sqlite model-postgres
model-sqlite:
	env -u DATABASE_URL MODEL_MINUTES=$(MINUTES) $(MODEL)
model-postgres:
	MODEL_MINUTES=$(MINUTES) scripts/with-postgres.sh $(MODEL)

# The fault-test table in docs/faults.md, from the last runs' records in var/faults/.
faults-table:
	$(BIN)/python -m tests.faults.results --write

# The randomized soak (docs/faults.md, "The soak"): three run_scheduler replicas under a seeded
# nemesis on a throwaway PostgreSQL cluster, the soak job with catch_up "all" and send_reminders
# against the SMTP stand-in (--reminders). SEED=N replays a
# seed's plan (default: a random one, printed); SOAK_DURATION seconds of nemesis; SOAK_CATCH_UP
# the job's policy; SOAK_ARGS more options (python -m tests.soak --help).
SOAK_DURATION ?= 600
SOAK_CATCH_UP ?= all
soak: $(BIN)/.installed-dev
	scripts/with-postgres.sh $(BIN)/python -m tests.soak --reminders --duration $(SOAK_DURATION) --catch-up $(SOAK_CATCH_UP) $(if $(SEED),--seed $(SEED)) $(SOAK_ARGS)

# The soak's table in docs/faults.md, from the last soak's record (var/soak/last.json).
soak-table:
	$(BIN)/python -m tests.soak.report --write

# The failover table in docs/faults.md (what holds on one server, with a synchronous and with an
# asynchronous standby), from the last soak of each: make soak, and SOAK_ARGS="--failover sync|async".
soak-failover-table:
	$(BIN)/python -m tests.soak.report --replication --write

demo: setup
	$(BIN)/python scripts/demo.py

# Benchmarks (docs/benchmarks.md): SQLite always; PostgreSQL too with
# PG=postgres://user@host:port/db (its tables are emptied) or PG=throwaway
# (a temporary initdb cluster). BENCH_ARGS passes options: python -m bench --help.
bench: $(BIN)/.installed-dev
	$(BIN)/python -m bench $(if $(PG),--postgres $(PG)) $(BENCH_ARGS)

clean:
	rm -rf $(VENV) db.sqlite3 db.sqlite3-* test_db.sqlite3*
