"""``speceyes bench``: throughput figures, printed (never asserted by tests).

One module per kind of bench, loaded only when it runs (as every command is: see
``cli.main``), so ``bench agent`` on a GPU image needs neither Celery nor a database
driver. Each module parses and prints; what it runs and measures is ``lab.bench``.
"""

from __future__ import annotations

DESCRIPTION = (
    "Measure throughput and print the figures (a test never asserts a speed; methods and "
    "dated results: docs/benchmarks.md). Each KIND has its own --help."
)

# kind -> (module, its line in --help)
COMMANDS = {
    "fast": ("cli.bench.fast", "fast-stage (phases I-III) jobs/s against batch size"),
    "embedded": (
        "cli.bench.embedded",
        "the embedded runner's jobs/s: funnel against --baseline (simulated costs)",
    ),
    "agent": (
        "cli.bench.agent",
        "trajectories/s of one agent worker against its concurrency (lockstep batching)",
    ),
    "sandbox": (
        "cli.bench.sandbox",
        "the code sandbox's overhead per execution (Thyme), start to result",
    ),
    "pipeline": (
        "cli.bench.pipeline",
        "the distributed pipeline end to end: jobs/s and submit-to-done latency",
    ),
    "priority": (
        "cli.bench.priority",
        "a single high job's wait while 100,000 jobs wait (zero model cost)",
    ),
    "submit": (
        "cli.bench.submit",
        "a corpus of a million rows into PostgreSQL: rows/s and peak memory",
    ),
    "scale": (
        "cli.bench.scale",
        "each operation's cost as the store grows to 1,000,000 jobs (zero model cost)",
    ),
    "synth": (
        "cli.bench.synth",
        "the SpecEyes-Synth report: accuracy, gates, speedup (trained tiny models)",
    ),
    "accounting": (
        "cli.bench.accounting",
        "--estimate and the saved figure against full and agent-alone runs (synth)",
    ),
    "ui": (
        "cli.bench.ui",
        "the review UI's server time per page over a seeded batch of 100,000 jobs",
    ),
}
