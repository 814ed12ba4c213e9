"""The chaos campaign: wfsub nodes, a private Postgres server, TCP proxies and a SQLite owner under seeded faults,
and a checker of what the stores hold (see `_campaign` and `_checker`; docs/contributing/chaos.md).

It lives under tests/ because it is a test of wfsub, not a part of it: it imports the test suite's cuttable
proxy (`tests/stores/_proxy.py`), and its checker's unit tests (`test_checker.py`) run in `make test`. The run
itself is a program, not a pytest test (`python -m tests.chaos`; `make chaos`, and `make chaos-ci` for CI's
one-minute seeded run, a step of its own in `.ci/run`): it starts a Postgres server and a dozen processes and
takes a minute or more, where `make test` must stay within five minutes on two cores, and a long run is the
point of it.
"""
