"""Each guarantee our documents state, tied to the change that would break it and the
test that notices: a guarantee whose test cannot fail is a claim, not a guarantee.

``python -m tests.mutation promises`` applies each change to the tree, runs its tests
(they must fail), and puts the file back. docs/testing.md shows the same table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Promise:
    promise: str  # as the document states it
    document: str
    path: str  # the file the change is made in
    old: str  # exactly once in it
    new: str
    tests: tuple[str, ...]  # pytest node ids; at least one must fail under the change


PROMISES = (
    Promise(
        "The gate's confidence is sigmoid(0.6 S)",
        "README.md, common/pipeline/gate.py",
        "common/pipeline/gate.py",
        "return torch.sigmoid(SQUASH * score), score, per_token",
        "return torch.sigmoid(score), score, per_token",
        ("tests/common/pipeline/test_gate.py::test_tau_098_is_a_min_score_of_6_486",),
    ),
    Promise(
        "A second delivery of an outcome changes nothing (exactly-once recording)",
        "docs/architecture.md",
        "common/store/claims.py",
        '"WHERE jobs.id = rows.c_id AND jobs.status = :expect_status "',
        '"WHERE jobs.id = rows.c_id AND TRUE "',
        ("tests/common/store/test_claims.py::test_recording_an_outcome_twice_leaves_one_result",),
    ),
    Promise(
        "Claims find their jobs by primary key alone, whatever the statistics",
        "docs/benchmarks.md",
        "common/store/claims.py",
        'status = func.coalesce(_JOBS.c.status, "")',
        "status = _JOBS.c.status",
        (
            "tests/common/store/test_claims.py::"
            "test_a_claim_by_ids_reads_its_jobs_by_primary_key_whatever_the_statistics",
        ),
    ),
    Promise(
        "A running job is taken over only when stale or handed back",
        "docs/operations.md",
        "common/store/claims.py",
        "stale = None  # running jobs started before this",
        "stale = now  # running jobs started before this",
        (
            "tests/common/pipeline/test_work.py::test_running_jobs_are_taken_over_only_when_stale_or_handed_back",
        ),
    ),
    Promise(
        "Running the same command again resumes without redoing",
        "docs/annotating.md",
        "common/pipeline/submit.py",
        "batch_key = idempotency_key(source, [chunks.first_question], marked_key)",
        "batch_key = idempotency_key(source, [chunks.first_question], marked_key, time.time())",
        (
            "tests/cli/test_annotate.py::test_running_the_same_command_again_resumes_without_redoing",
        ),
    ),
    Promise(
        "The export's columns are stable",
        "docs/annotating.md",
        "common/store/export.py",
        '("screen_needs_tools", pa.bool_()),',
        '("needs_tools", pa.bool_()),',
        ("tests/common/store/test_export.py::test_the_schema_is_the_published_one",),
    ),
    Promise(
        "The export's types are stable",
        "docs/annotating.md",
        "common/store/export.py",
        '("confidence", pa.float64()),',
        '("confidence", pa.float32()),',
        (
            "tests/common/store/test_export.py::test_an_exported_file_reads_with_the_published_types",
        ),
    ),
    Promise(
        "A form without the session's token changes nothing (CSRF)",
        "SECURITY.md",
        "api/ui/session.py",
        "    if not same(token, ui.csrf):",
        "    if token and not same(token, ui.csrf):",
        ("tests/api/ui/test_pages.py::test_a_form_without_the_sessions_token_changes_nothing",),
    ),
    Promise(
        "Every user string is escaped on /ui (a reviewer's answer and name included)",
        "SECURITY.md",
        "api/ui/templates/review_form.html",
        "{{ job.reviewed_answer }}",
        "{{ job.reviewed_answer | safe }}",
        (
            "tests/api/ui/test_pages.py::test_what_users_and_models_wrote_is_escaped_on_every_page",
            "tests/api/ui/test_browser.py::test_hostile_text_shows_as_text_and_no_script_runs",
        ),
    ),
    Promise(
        "Idempotency keys are scoped to the tenant",
        "SECURITY.md",
        "common/store/submission.py",
        'batch_key = idempotency_key("client-batch", client_key, *scope(tenant))',
        'batch_key = idempotency_key("client-batch", client_key)',
        ("tests/api/test_hardening.py::test_an_idempotency_key_names_one_batch_per_tenant",),
    ),
    Promise(
        "Jobs are committed, then enqueued",
        "docs/api.md",
        "common/pipeline/dispatch.py",
        "        started = time.perf_counter()\n        try:\n"
        "            for priority, ids in _by_priority(outbox.fast, urgency):\n"
        "                self.send_fast(ids, delay_s=delay_s, priority=priority)",
        "            self.send_fast(outbox.fast, delay_s=delay_s)\n"
        "        started = time.perf_counter()\n        try:\n"
        "            for priority, ids in []:\n                pass",
        (
            "tests/common/pipeline/test_dispatch.py::test_jobs_are_sent_only_once_their_transaction_has_committed",
        ),
    ),
    Promise(
        "A bad job fails alone; its batch-mates are untouched",
        "README.md",
        "common/pipeline/work/fast.py",
        "            if len(group) > 1:\n",
        "            if False:\n",
        ("tests/common/pipeline/test_runner.py::test_a_poison_job_fails_alone_after_its_attempts",),
    ),
    Promise(
        "A killed slow worker's trajectory is sent again in the sweep that finds it",
        "README.md, docs/operations.md",
        "common/pipeline/reconcile.py",
        "            outbox.to_slow(orphans[Stage.AGENT])\n",
        "",
        (
            "tests/common/pipeline/test_reconcile.py::"
            "test_a_dead_slow_workers_trajectory_goes_back_to_the_slow_queue_at_once",
        ),
    ),
    Promise(
        "The sandbox's memory is its control group's limit",
        "docs/sandbox.md",
        "common/sandbox/cgroup.py",
        '_write(memory / "memory.limit_in_bytes", str(memory_bytes))',
        '_write(memory / "memory.limit_in_bytes", str(memory_bytes * 8))',
        (
            "tests/common/sandbox/test_hostile.py::"
            "test_touching_more_memory_than_the_limit_is_killed_by_the_control_group",
        ),
    ),
    Promise(
        "The worker holds only what the model is shown (an image's view is checked)",
        "docs/sandbox.md",
        "common/sandbox/channel.py",
        "            if limits.grid.view(*source) != (width, height):",
        "            if False:",
        (
            "tests/common/sandbox/test_channel.py::"
            "test_an_image_off_the_grid_or_over_the_budget_is_refused",
        ),
    ),
    Promise(
        "The guest dies with its worker, its janitor killed too",
        "docs/sandbox.md",
        "common/sandbox/guest/harness.py",
        "                _end(guest)  # stdin hung up: the worker is gone",
        "                watch.unregister(0)  # (the mutant: ignore it)",
        (
            "tests/common/sandbox/test_hostile.py::"
            "test_without_its_janitor_the_guest_still_dies_with_its_worker",
        ),
    ),
    Promise(
        "The guest may signal only itself, never its init",
        "docs/sandbox.md",
        "common/sandbox/guest/seccomp.py",
        'to_itself = {"kill": (0, "in", (own_pid,)), "tgkill": (0, "in", (own_pid,))}',
        "to_itself: dict[str, Condition] = {}",
        (
            "tests/common/sandbox/test_seccomp.py::test_the_filter_answers_each_call_as_its_rules_say",
            "tests/common/sandbox/test_hostile.py::"
            "test_it_cannot_signal_or_trace_its_parent_or_its_init",
        ),
    ),
    Promise(
        "An exit code is never read as a signal",
        "docs/sandbox.md",
        "common/sandbox/execution.py",
        "return ExitCode(code, -code) if code < 0 else ExitCode(code, 0)",
        "return ExitCode(code, -code) if code < 0 else ExitCode(code, max(0, code - 128))",
        ("tests/common/sandbox/test_hostile.py::test_an_exit_code_is_never_read_as_a_signal",),
    ),
    Promise(
        "A worker that is not root may not set the times of the host's device nodes",
        "docs/sandbox.md",
        "common/sandbox/guest/harness.py",
        'seccomp.install(refuse_times=limits["host_devices"])',
        "seccomp.install(refuse_times=False)",
        (
            "tests/common/sandbox/test_unprivileged.py::"
            "test_an_unprivileged_worker_contains_the_same_bombs",
        ),
    ),
)
