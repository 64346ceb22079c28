"""``speceyes annotate``: the main job, a whole corpus through the funnel."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from cli.compose import make_dispatcher
from cli.estimate import draw, print_estimate
from cli.follow import follow, print_summary, progress_bar, say_line
from cli.options import add_pipeline_flags, add_settings, require_shared_store, settings_from_args
from common.contracts import Priority, SourceRow
from common.errors import ConfigurationError, InvalidInput
from common.evaluation.judge import Judge, judge_batch
from common.limits import check_name, check_query
from common.logs import JOBS
from common.pipeline.audit import describe
from common.pipeline.runner import EmbeddedRunner
from common.pipeline.submit import submit_corpus
from common.sources.corpus import Corpus, open_source
from common.sources.locations import name_of
from common.sources.webdataset import Columns
from common.store.analytics import REFERENCE_COUNTS, STRICT_COUNTS, batch_scores
from common.store.db import Store, open_store
from common.store.export import (
    LAYOUTS,
    Output,
    batch_rows,
    check_labelled,
    check_output,
    export,
    parts_of,
    write_labelled,
)
from common.store.liveness import live_workers
from common.store.tables import Batch

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from common.config import Settings
    from common.pipeline.dispatch import Dispatcher
    from common.store.reads import BatchCounts

DESCRIPTION = """\
Annotate a corpus: every image + question goes through the SpecEyes funnel (screen,
speculate with the small model, gate, and the agent for the rest), on this machine, with
the job store in a database (a SQLite file by default).

SOURCE is one of:
  a folder of images (searched recursively; needs --question);
  a manifest: JSONL with one {"image": ..., "question": ..., "options": [...], "id": ...}
    per line, or CSV with the same columns (options as a JSON list); image paths are
    relative to the manifest;
  WebDataset shards: a .tar, or a brace pattern 'shards/{00000..00127}.tar' (quote it);
    each sample's jpg/png/webp is its image, its .json holds question, options, answer
    (else -q, else its .txt), its key is the row id;
  a Hugging Face dataset: a save_to_disk folder, or .parquet / .arrow files (a brace
    pattern too) with an image column (bytes, datasets' Image, or a path); name the
    columns with --image-column, --question-column, --options-column, --id-column,
    --answer-column;
  the paper's benchmarks in their published layouts: a V* folder (direct_attributes/,
    relative_position/), an HR-Bench .tsv, a POPE .parquet or folder (Full/*.parquet);
    the summary then scores each split by our rules and by the reference's
    (--judge-url / --judge-model: its LLM judge for the rest).
Any of these may be a URL: s3://bucket/prefix/, gs://..., https://... (credentials from
each store's usual environment: AWS_*, GOOGLE_APPLICATION_CREDENTIALS).

Nothing is copied: a job refers to its image where it lies (a file, a tar member, a
table row, an object) with its digest, and the workers read it from there; content that
changed since fails its job with image_changed. --copy-images copies every image into
the upload store instead, for sources the workers cannot reach. Rows are read, hashed
and written a chunk at a time: memory stays flat whatever the corpus's size.

A row's optional answer (the right option's text or letter, or yes/no) adds an accuracy
line to the summary. Broken rows (a sample without an image, bad JSON, no question) are
reported, recorded as failed jobs naming the file and line or the shard and key, and the
rest goes on.

--out writes the results: FILE.jsonl or FILE.parquet; DIR/ or s3://bucket/prefix/ for
Parquet parts of --shard-rows rows; with --out-format webdataset (a WebDataset SOURCE),
new shards that keep every sample and add its KEY.speceyes.json.

Running the same command again resumes: finished jobs are kept, the rest is done. The
exit code is 0 when every job succeeded, 1 when any failed, 2 for bad usage, 130 when
interrupted (Ctrl-C leaves unfinished jobs queued for the next run).

Distributed: with a broker (--broker / SPECEYES_BROKER_URL, or --distributed to insist),
the jobs are committed to the store (--db, PostgreSQL), sent to the fast queue, and the
command follows their progress in the store while `speceyes worker fast` and
`speceyes worker slow` processes do the work; the workers' own model and gate settings
apply. Ctrl-C stops following; the jobs go on.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "source", metavar="SOURCE", help="folder, manifest, shards, dataset, table or URL"
    )
    parser.add_argument(
        "--question", "-q", help="question for every image that brings none (a folder's)"
    )
    parser.add_argument(
        "--options", nargs="+", metavar="OPTION", help="options for rows that bring none"
    )
    parser.add_argument("--name", help="batch name (default: the SOURCE's name)")
    parser.add_argument(
        "--priority",
        choices=[priority.value for priority in Priority],
        default=Priority.NORMAL.value,
        help="which waiting work the stages take first (default normal; a single API job "
        "is high): low lets a large corpus give way to everything else",
    )
    columns = parser.add_argument_group(
        "columns", "which column of a table (or field of a sample's .json) holds what"
    )
    columns.add_argument(
        "--image-column", metavar="NAME", help="default: 'image', else the first of bytes"
    )
    for part, default in (("question", "question"), ("options", "options"), ("answer", "answer")):
        columns.add_argument(
            f"--{part}-column", metavar="NAME", default=default, help=f"default: '{default}'"
        )
    columns.add_argument(
        "--id-column", metavar="NAME", help="default: 'id', else the sample key or row number"
    )
    add_settings(parser, "sources.copy_images")
    parser.add_argument(
        "--out",
        metavar="TARGET",
        help="write results to FILE.jsonl, FILE.parquet, DIR/ or a URL (see above)",
    )
    parser.add_argument(
        "--out-format",
        choices=LAYOUTS,
        default="auto",
        help="auto: by --out's name; webdataset: labelled shards of a WebDataset SOURCE",
    )
    add_settings(parser, "sources.export_shard_rows", "funnel.fast_batch_size", "agent.workers")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--estimate",
        type=_positive,
        metavar="N",
        help="before a run: the funnel on N rows drawn at random, then the whole corpus's "
        "expected beta, alpha, accepted share, model time and wall time (95%% intervals) "
        "and accuracy where answers are known; keeps only the sample's jobs (batch "
        "NAME.estimate), which the full run reuses",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="which rows --estimate draws (default 0)"
    )
    add_settings(parser, "judge.url", "judge.model")
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="run on the workers of the broker (an error if none is configured)",
    )
    add_pipeline_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    # Each failed job is counted in the summary and named by `speceyes jobs list BATCH
    # --status failed`; a line each as it happens only with -v.
    if not logging.getLogger().isEnabledFor(logging.INFO):
        JOBS.setLevel(logging.ERROR)
    if args.distributed and not settings.broker.url:
        raise ConfigurationError(
            "--distributed needs a broker: --broker redis://HOST:6379/0 or SPECEYES_BROKER_URL"
        )
    require_shared_store(settings)
    output = check_output(args.out, args.out_format) if args.out is not None else None
    if args.question is not None:  # (each row is checked as it is submitted)
        check_query(args.question, args.options, settings.requests)
    corpus = open_source(
        args.source,
        args.question,
        args.options,
        settings=settings,
        columns=Columns(
            image=args.image_column,
            question=args.question_column,
            options=args.options_column,
            id=args.id_column,
            answer=args.answer_column,
        ),
        for_thyme=settings.agent.kind == "thyme",
    )
    name = args.name or name_of(corpus.location)
    sample = None
    if args.estimate is not None:
        if output is not None:
            raise InvalidInput("--estimate runs a sample: it writes no --out")
        name += ".estimate"
        sample = draw(corpus.rows, args.estimate, args.seed)
    check_name(name, settings.requests)
    if output is not None and output.layout == "webdataset":
        if corpus.kind != "webdataset":
            raise InvalidInput("--out-format webdataset needs WebDataset shards as the SOURCE")
        check_labelled(corpus.shards, output.target)
    sessions = open_store(settings.database_url)
    print(f"speceyes: job store {sessions.described}", file=sys.stderr)
    # A model that cannot be had or a broker that does not answer fails now, before any
    # job is created (and leaves no empty store behind).
    try:
        dispatcher = make_dispatcher(settings, sessions, say=say_line)
        dispatcher.check()
    except BaseException:
        sessions.discard_if_unused()
        raise
    with progress_bar(corpus.total, "submitting", args.no_progress, unit="row") as bar:
        read = 0

        def counted() -> Iterator[SourceRow]:
            nonlocal read
            for row in corpus.rows if sample is None else sample.rows:
                if row.error is not None:
                    bar.write(f"speceyes: {row.error[1]} (recorded as a failed job)", sys.stderr)
                read += 1
                yield row

        submitted = submit_corpus(
            sessions,
            counted(),
            source=corpus.location,
            name=name,
            settings=settings,
            dispatcher=dispatcher,
            on_item=lambda: bar.update(1),
            priority=Priority(args.priority),
            marked=None if sample is None else sample.marker(args.seed),
        )
        rate = bar.format_dict["rate"]
    verb = "created" if submitted.batch_created else "resumed"
    pace = f" ({rate:.0f} rows/s)" if rate else ""
    print(
        f"batch {submitted.batch_id} {verb}: {read} rows, {submitted.jobs_created} new jobs{pace}"
    )
    if settings.broker.url:
        print(
            f"sent {submitted.sent_fast} jobs to the fast queue and {submitted.sent_slow} to "
            "the slow queue"
        )
    try:
        result = follow(dispatcher, sessions, submitted.batch_id, args.no_progress)
    finally:
        dispatcher.close()
    print_summary(result, name)
    if sample is not None and not result.interrupted:
        callers = settings.agent.workers + 1  # (the fast stage, and each trajectory)
        if settings.broker.url:
            with sessions() as session:
                live = live_workers(session, settings.recovery.worker_dead_after_s)
            callers = max(1, len(live))
        print_estimate(sessions, submitted.batch_id, sample, result.seconds, callers)
    _print_audit(sessions, submitted.batch_id, settings)
    if settings.judge.url and not result.interrupted:
        _judge(sessions, submitted.batch_id, settings)
    _print_accuracy(sessions, submitted.batch_id)
    if output is not None:
        _export(sessions, submitted.batch_id, output, corpus, settings, result.counts)
    if result.interrupted:
        if settings.broker.url:
            print("stopped following: the workers go on; run the same command to follow again")
        else:
            print("interrupted: unfinished jobs stay queued; run the same command to resume")
            _leave_after_interrupt(dispatcher, sessions)
        return 130
    return 1 if result.counts.failures or result.counts.cancellations else 0


def _positive(value: str) -> int:
    number = int(value)
    if number < 2:
        raise argparse.ArgumentTypeError(f"needs at least 2 rows, not {value}")
    return number


def _leave_after_interrupt(dispatcher: Dispatcher, sessions: Store) -> None:
    """Leave at once, with the interrupt's code, once everything is committed and printed.

    The stage threads were asked to end and waited for (``EmbeddedRunner``); one that
    outran the wait (a second Ctrl-C) may still be inside torch. Even when they all
    ended, Python's own shutdown after a generation was cut short aborted now and then
    under load in torch's teardown (``terminate called without an active exception``,
    about 1 interrupted run in 20 on a busy 2-core machine), with no thread of ours
    left. Nothing of ours runs at exit that matters: the store is closed here."""
    if not isinstance(dispatcher, EmbeddedRunner):
        return
    if dispatcher.lingering() or "torch" in sys.modules:
        sessions.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)


def _print_audit(sessions: sessionmaker[Session], batch_id: str, settings: Settings) -> None:
    with sessions() as session:
        batch = session.get(Batch, batch_id)
        for line in describe(session, settings, batch) if batch is not None else []:
            print(line)


def _judge(sessions: sessionmaker[Session], batch_id: str, settings: Settings) -> None:
    """Ask the judge about the undecided benchmark rows (cached verdicts are reused)."""

    key = settings.judge.api_key.get_secret_value() if settings.judge.api_key else None
    judge = Judge(
        settings.judge.url or "",
        settings.judge.model or "",
        api_key=key,
        timeout_s=settings.judge.timeout_s,
        concurrency=settings.judge.concurrency,
    )
    try:
        counts = judge_batch(sessions, batch_id, judge, concurrency=settings.judge.concurrency)
    finally:
        judge.close()
    print(f"judge        {counts.asked} asked, {counts.cached} from the cache ({judge.model})")


def _print_accuracy(sessions: sessionmaker[Session], batch_id: str) -> None:
    with sessions() as session:
        (scored, correct), splits = batch_scores(session, batch_id)
    if scored:
        print(
            f"accuracy     {correct / scored:.1%} ({correct} of {scored} rows with a known answer;"
            " a failed row is wrong)"
        )
    if splits:
        print("split                      rows   strict  reference  failed  undecided")
        for split in splits:
            print(
                f"{split.split:<26} {split.rows:>4}  {split.strict:>6.1%}  {split.reference:>9.1%}"
                f"  {split.failed:>6}  {split.undecided:>9}"
            )
        print(f"strict: {STRICT_COUNTS}; reference: {REFERENCE_COUNTS}")


def _export(
    sessions: sessionmaker[Session],
    batch_id: str,
    output: Output,
    corpus: Corpus,
    settings: Settings,
    counts: BatchCounts,
) -> None:
    with sessions() as session:
        if output.layout == "webdataset":
            shards, samples, labelled = write_labelled(
                session, batch_id, corpus.shards, output.target
            )
            print(
                f"wrote {shards} shards to {output.target}: {samples} samples, {labelled} "
                "with a speceyes.json"
            )
            return
        count, files = export(
            batch_rows(session, batch_id), output, settings.sources.export_shard_rows, batch_id
        )
    where = (
        f"{parts_of(files)} under {output.target}" if output.layout == "parquet" else output.target
    )
    unfinished = counts.jobs - counts.finished
    if unfinished:  # (an interrupted run, or one that follows workers that are not done)
        print(
            f"wrote {count} rows to {where}, {unfinished} job(s) of them not finished (status "
            "queued, deferred or running, no answer yet): run the same command to finish "
            "them, and it writes the file again"
        )
    else:
        print(f"wrote {count} rows to {where}")
