# One command to set up and run the job, one to set up and run every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The host suite's venvs on the wheel (below, "the distribution"); Django 6.1 needs Python 3.12.
WHEEL_VENVS := var/wheel
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python $(PYENV_ROOT)/versions/3.12.*/bin/python /root/.pyenv/versions/3.12.*/bin/python) python3.12)
export DJANGO_DEBUG ?= 1

.PHONY: model model-sqlite model-postgres setup run test test-sqlite test-postgres test-sqlite-project test-sqlite-host test-postgres-project test-postgres-host test-soak wheel test-wheel-django52 test-wheel-django61 faults-table soak soak-mongodb soak-table soak-mongodb-table soak-failover-table lint demo clean bench compare-periodic requirements

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

requirements: $(BIN)/.installed-dev $(WHEEL_VENVS)/piptools312/bin/.installed
	$(PIP_COMPILE) --output-file requirements.txt requirements.in
	$(PIP_COMPILE) --output-file requirements-dev.txt requirements-dev.in
	$(PIP_COMPILE) --output-file requirements-wheel-django52.txt requirements-wheel-django52.in
	$(subst $(BIN)/pip-compile,$(WHEEL_VENVS)/piptools312/bin/pip-compile,$(PIP_COMPILE)) \
		--output-file requirements-wheel-django61.txt requirements-wheel-django61.in

# pip-compile under Python 3.12 for the Django 6.1 set (Django 6.1 needs 3.12): pip-tools and
# its dependencies at requirements-dev.txt's pins and hashes.
PIP_TOOLS := pip-tools build click packaging pip pyproject-hooks setuptools wheel
$(WHEEL_VENVS)/piptools312/bin/.installed: requirements-dev.txt
	rm -rf $(@D:/bin=) && $(PYTHON312) -m venv $(@D:/bin=)
	awk -v keep="$(PIP_TOOLS)" 'BEGIN { split(keep, k, " "); for (i in k) want[k[i]] = 1 } \
		/^[a-z]/ { split($$1, name, "=="); on = name[1] in want } on' requirements-dev.txt > $(@D)/pins.txt
	$(@D)/pip install --disable-pip-version-check -q --require-hashes --no-deps -r $(@D)/pins.txt
	touch $@

setup: $(BIN)/.installed
	$(BIN)/python manage.py migrate --noinput -v 0

run: setup
	$(BIN)/python manage.py sync_contests

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The whole suite in four runs at the same time, two on the SQLite default and two on throwaway
# PostgreSQL clusters (one each): on each database the project's own tests, and tests/locks under a
# project that installs only the locks app (tests/hostproject/settings.py), on the installed wheel
# (scripts/test-wheel.sh): under Django 6.1 on SQLite, under Django 5.2 LTS (the project's own) on
# PostgreSQL. tests/locks runs there only, not in the project's runs: once per database, each time
# on the app as a user installs it. Much of their time is spent waiting for real slots and
# processes, not on the two cores: on one 2-core machine, CI took 25 min this way, 30 in two halves. The
# runs share nothing: their own databases, clusters and temporary directories, the crontab tests
# one at a time (a lock file). Each one's output is printed when it ends. The MongoDB suite
# (tests/test_mongodb.py) and the README's commands (tests/test_readme.py) run once, in the
# project's SQLite run: without MONGODB_URI the MongoDB suite starts its own SecantusDB server
# (tests/mongo_server.py, docs/mongodb.md), with it it uses that mongod. Beside them, on a cluster
# of its own, the short soak (tests/soak/test_soak.py: about two minutes, mostly waiting for its
# slots), which restarts its server. `make test-sqlite` / `make test-postgres`: one database's two.
# The host suite on this checkout's locks/ instead: $(PYTEST) --ds tests.hostproject.settings.
PYTEST := $(BIN)/python -m pytest
HOST := --ds tests.hostproject.settings
ONCE := --ignore=tests/locks --ignore=tests/test_mongodb.py --ignore=tests/test_readme.py
SOAK := tests/soak/test_soak.py

test: lint
	$(MAKE) --no-print-directory -j5 --output-sync=target \
		test-postgres-host test-sqlite-host test-postgres-project test-sqlite-project test-soak

# Each run ends with its 15 slowest tests (--durations): where the runs' time goes, to balance them.
SLOWEST := --durations=15
test-sqlite: test-sqlite-project test-sqlite-host
test-postgres: test-postgres-project test-postgres-host

test-sqlite-project: $(BIN)/.installed-dev
	env -u DATABASE_URL $(PYTEST) $(SLOWEST) --ignore=tests/locks --ignore=$(SOAK)

test-sqlite-host: $(BIN)/.installed-dev wheel $(WHEEL_VENVS)/django61/bin/.installed
	env -u DATABASE_URL scripts/test-wheel.sh $(WHEEL_VENVS)/django61 $(SLOWEST)

test-postgres-project: $(BIN)/.installed-dev
	scripts/with-postgres.sh $(PYTEST) $(SLOWEST) $(ONCE) --ignore=$(SOAK)

test-postgres-host: $(BIN)/.installed-dev wheel $(WHEEL_VENVS)/django52/bin/.installed
	scripts/with-postgres.sh scripts/test-wheel.sh $(WHEEL_VENVS)/django52 $(SLOWEST)

test-soak: $(BIN)/.installed-dev
	scripts/with-postgres.sh $(PYTEST) $(SOAK)

# --- the distribution (pyproject.toml): the locks app as the wheel django-tick-locks ---------------
# `make wheel`: dist/django_tick_locks-VERSION-py3-none-any.whl, built from this tree with the
# pinned setuptools of requirements-dev.txt (no build isolation: nothing fetched, nothing unpinned).
# The host suite runs on it installed in a venv of its own that holds nothing else but the wheel's
# dependencies and the test tools (requirements-wheel-django*.txt, pinned with hashes), from a copy
# of tests/ (scripts/test-wheel.sh): Django 6.1 on Python 3.12 in test-sqlite-host, Django 5.2 LTS
# on Python 3.11 in test-postgres-host. The venvs live in var/wheel/, rebuilt when their pins change.
wheel: $(BIN)/.installed-dev
	rm -rf build dist *.egg-info
	$(BIN)/python -m pip wheel --disable-pip-version-check -q --no-deps --no-build-isolation -w dist .
	rm -rf build *.egg-info

$(WHEEL_VENVS)/django52/bin/.installed: requirements-wheel-django52.txt
	rm -rf $(@D:/bin=) && $(PYTHON) -m venv $(@D:/bin=)
	$(@D)/pip install --disable-pip-version-check -q --require-hashes -r $<
	touch $@

$(WHEEL_VENVS)/django61/bin/.installed: requirements-wheel-django61.txt
	rm -rf $(@D:/bin=) && $(PYTHON312) -m venv $(@D:/bin=)
	$(@D)/pip install --disable-pip-version-check -q --require-hashes -r $<
	touch $@

# One of the two alone, on SQLite (make test runs each once, in test-sqlite-host and test-postgres-host).
test-wheel-django52 test-wheel-django61: test-wheel-%: wheel $(WHEEL_VENVS)/%/bin/.installed
	env -u DATABASE_URL scripts/test-wheel.sh $(WHEEL_VENVS)/$*

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

# The soak on MongoDB (docs/faults.md, "The soak on MongoDB"): the same replicas and soak job on
# MONGODB_URI's mongod, else on a SecantusDB server of its own; the nemesis kill, pause, term.
SOAK_MONGODB_DURATION ?= 240
soak-mongodb: $(BIN)/.installed-dev
	$(BIN)/python -m tests.soak --db mongodb --duration $(SOAK_MONGODB_DURATION) --catch-up $(SOAK_CATCH_UP) $(if $(SEED),--seed $(SEED)) $(SOAK_ARGS)

# The soak's table in docs/faults.md, from the last soak's record (var/soak/last.json); the
# MongoDB soak's from var/soak/last-mongodb.json.
soak-table:
	$(BIN)/python -m tests.soak.report --write

soak-mongodb-table:
	$(BIN)/python -m tests.soak.report --mongodb --write

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

# Four periodic schedulers on one scenario (3 replicas, a kill, a missed slot), about 8 minutes on
# a throwaway PostgreSQL: docs/periodic-comparison.md. Its venvs are var/compare/<tool>; not in `test`.
compare-periodic: $(BIN)/.installed-dev
	$(BIN)/python -m bench.compare_periodic $(COMPARE_ARGS)

clean:
	rm -rf $(VENV) db.sqlite3 db.sqlite3-* test_db.sqlite3* build dist *.egg-info $(WHEEL_VENVS)
