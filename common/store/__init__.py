"""The job store: the database is the source of truth and, embedded, the queue.

- ``tables``: the ORM tables (the Alembic migrations create them);
- ``db``: engines, sessions, migrations;
- ``submission``: new jobs and batches, idempotently (annotate, the API, benchmarks);
- ``claims``: the state machine: claims and records, each write conditional;
- ``reads``: progress counts, results in order, single jobs;
- ``keys``: the HTTP API's keys, stored hashed.

Nothing here decodes an image or sends a message: the caller's transaction commits, and
only then is work sent on (``common.pipeline.dispatch``).
"""
