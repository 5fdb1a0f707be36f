"""A randomized soak of the lock (issue 17): ``python -m tests.soak`` (``make soak``).

driver.py runs it (its docstring: the phases, and how the reminders part plugs in),
cluster.py holds the replicas, proxies and server, nemesis.py draws and runs the faults,
checker.py judges the database afterwards, report.py writes the record and the table in
docs/faults.md. test_soak.py is the short seeded soak of ``make test``'s PostgreSQL pass.
"""
