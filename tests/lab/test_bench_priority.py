"""``speceyes bench priority`` at a small size: it runs, and in the same run the high
job waits less than a normal one sent at that moment would have (a ratio, not a time)."""

from __future__ import annotations

from lab.bench import priority


def test_a_high_job_overtakes_the_waiting_corpus_in_the_bench():
    figures = priority.measure(3000, None)
    assert figures.waiting > 2000 and figures.pace > 0
    assert figures.wait_s < figures.normal_wait_s / 4, figures
