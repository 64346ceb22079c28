"""The modules that carry our promises, and the tests that answer for each, for the
mutation run (cosmic-ray: ``python -m tests.mutation modules``).

Each mutant of a module runs that module's tests with ``-x``: a mutant is killed when
one fails. The operators are cut to those that say something about a promise (a
boundary, a negation, a constant, a skipped loop, a removed guard); the ten-way
arithmetic swaps cosmic-ray also offers are left out (``EXCLUDED_OPERATORS``), as
mostly equivalent on this code and five times the run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Module:
    name: str
    path: str
    tests: tuple[str, ...]
    timeout_s: float = 120.0


MODULES = (
    Module("gate", "common/pipeline/gate.py", ("tests/common/pipeline/test_gate.py",)),
    Module(
        "claims",
        "common/store/claims.py",
        (
            "tests/common/store/test_claims.py",
            "tests/common/pipeline/test_work.py",
            "tests/common/pipeline/test_reconcile.py",
        ),
    ),
    Module(
        "submission",
        "common/store/submission.py",
        (
            "tests/common/store/test_submission.py",
            "tests/common/pipeline/test_submit.py",
            "tests/api/test_hardening.py",
        ),
    ),
    Module(
        "reconcile", "common/pipeline/reconcile.py", ("tests/common/pipeline/test_reconcile.py",)
    ),
    Module(
        "dispatch",
        "common/pipeline/dispatch.py",
        ("tests/common/pipeline/test_dispatch.py", "tests/common/pipeline/test_runner.py"),
    ),
    Module(
        "work",
        "common/pipeline/work/fast.py",
        ("tests/common/pipeline/test_work.py", "tests/common/pipeline/test_runner.py"),
    ),
    Module(
        "work-unit",
        "common/pipeline/work/unit.py",
        (
            "tests/common/pipeline/test_work_unit.py",
            "tests/common/pipeline/test_work.py",
            "tests/common/pipeline/test_runner.py",
        ),
    ),
    Module(
        "export",
        "common/store/export.py",
        (
            "tests/common/store/test_export.py",
            "tests/cli/test_annotate.py::test_export_and_jobs_show",
            "tests/cli/test_sources.py::test_results_go_out_as_parquet_parts_and_as_labelled_shards",
            "tests/cli/test_sources.py::test_labelled_shards_never_overwrite_each_other_or_their_source",
        ),
    ),
    Module(
        "ui-session",
        "api/ui/session.py",
        ("tests/api/ui/test_session.py", "tests/api/ui/test_pages.py"),
    ),
    Module(
        "tenancy",
        "api/browse.py",
        (
            "tests/api/test_result_filter.py",
            "tests/api/test_listing.py",
            "tests/api/test_hardening.py",
            "tests/api/test_review_api.py",
            "tests/api/ui/test_pages.py",
        ),
    ),
    Module("channel", "common/sandbox/channel.py", ("tests/common/sandbox/test_channel.py",)),
    Module(
        "cgroup",
        "common/sandbox/cgroup.py",
        ("tests/common/sandbox/test_cgroup.py",),
        timeout_s=300.0,
    ),
)

# cosmic-ray operator names (regular expressions) that are not run
EXCLUDED_OPERATORS = (
    # of the binary operators, only + <-> - and * <-> / are kept
    r"core/ReplaceBinaryOperator_(?!Add_Sub|Sub_Add|Mul_Div|Div_Mul).*",
    # of the comparisons, only the boundaries and the negations
    r"core/ReplaceComparisonOperator_(?!Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Eq_NotEq|NotEq_Eq"
    r"|Is_IsNot|IsNot_Is|In_NotIn|NotIn_In).*",
    # unary: only removing a not
    r"core/ReplaceUnaryOperator_(?!Delete_Not).*",
)
