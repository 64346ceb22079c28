"""The unit of work every runner shares: tickets -> queries -> stage -> outcomes -> record.

``FastWork`` runs phases I-III over claimed jobs and ``AgentWork`` runs phase IV over one;
each records what happened with the conditional writes of ``common.store.claims`` and,
once that has committed, sends the jobs that go on (deferred ones to the agent, retries
back) through the ``Dispatcher``. The embedded runner claims waiting jobs from the store
and calls ``run``; a Celery task is handed job ids and calls ``run_ids``. Neither runner
holds any of this logic. (``unit``: what both share, ``fast`` and ``agent``: each half.)

Delivery is at-least-once (a message comes back when its worker dies; a restarted run
finds jobs left running), the effects exactly-once: a job that is finished, waits for the
other stage or runs elsewhere right now is left alone, and a job left ``running`` by a
dead worker is claimed again once it is stale.

Failures:

- a group that raises is split in halves until the failing job stands alone;
- a lone failing job is sent back (after ``retry_delay_s``) until it has used
  ``max_attempts``, then it is ``failed`` with the last error (``internal_error``);
- a ``RetryableError`` (a model server down) sends the whole group back without using
  its attempts;
- a job claimed before (its earlier worker died while holding it) runs in a group of its
  own, so a job that kills its worker takes nobody else down with it next time, and one
  over the limit is failed without running (``attempts_exhausted``).
"""

from common.pipeline.work.agent import AgentWork
from common.pipeline.work.fast import FastWork
from common.pipeline.work.unit import StageReport

__all__ = ["AgentWork", "FastWork", "StageReport"]
