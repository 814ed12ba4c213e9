"""The chaos campaign: wfsub nodes, a private Postgres server, TCP proxies and a SQLite owner under seeded faults,
and a checker of what the stores hold (see `_campaign` and `_checker`; README, "Chaos campaign").

It lives under tests/ because it is a test of wfsub, not a part of it: it imports the test suite's cuttable
proxy (`tests/stores/_proxy.py`), its checker has unit tests here that run in `make test`, and its one-minute
seeded run is a pytest test too (`test_campaign.py`, run by CI through `make chaos-ci`). `make chaos` runs it as a
program (`python -m tests.chaos`), for longer runs and other seeds.
"""
