"""Benchmarks: what ``speceyes bench`` runs and measures (``cli/bench.py`` only parses
and prints), each in a module of its own.

- ``workload``: the synthetic queries and corpora they run on;
- ``fast``: phases I-III against the batch size;
- ``agent``: trajectories per second against concurrency (``Lockstep``);
- ``sandbox``: one execution of model-written code, warm and cold;
- ``embedded``: the embedded runner at simulated costs, funnel against baseline;
- ``pipeline``: the distributed pipeline end to end, with its own workers;
- ``schedule``: an overhead-free replay of a run's draws (what no implementation beats);
- ``gpu.sh``: the one script a lent GPU machine runs (``make bench-gpu``).
"""
