"""``speceyes``: the command line.

The CLI is the composition root: it reads the settings, loads what a command needs and
calls into ``common``, ``api``, ``workers`` or ``lab``. Each command is a module of its
own, imported only when it runs (``COMMANDS``), so ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from common.errors import ConfigurationError, InvalidInput, SpecEyesError
from common.logs import TextFormatter

EPILOG = """\
examples:
  speceyes models build-tiny                      build the tiny offline checkpoints
  speceyes annotate samples/manifest.jsonl --small synth --large synth --threshold 0.9
                                                  annotate the sample corpus (offline; the
                                                  synth models' tau is 0.9, not 0.98)
  speceyes ask IMAGE -q "What is the color of the circle?" --small synth --large synth
        --threshold 0.9 --explain                 one query through the funnel, explained
  speceyes bench fast --batch-sizes 1,4,16,32     fast-stage throughput on tiny models
  speceyes config                                 the effective settings

Settings come from flags, then SPECEYES_* environment variables (see `speceyes config`).
"""


# Every command: the module that configures and runs it, and its line in --help. A
# command's module (and what it imports: torch, Celery, the web stack) is loaded only
# when that command runs, so `speceyes --help` and `speceyes config` stay instant.
COMMANDS: dict[str, tuple[str, str]] = {
    "annotate": ("cli.annotate", "annotate a folder or manifest of images (the main job)"),
    "ask": ("cli.ask", "answer one question about one image through the funnel"),
    "batches": ("cli.batches", "list the batches: name, id, created, jobs by status"),
    "jobs": ("cli.jobs", "a batch's jobs (list, --status failed) or one job (show)"),
    "cancel": ("cli.cancel", "cancel a batch or a job (what has finished is kept)"),
    "resume": ("cli.resume", "take a cancelled batch up again (done work is not redone)"),
    "retry": ("cli.retry", "run a batch's failed (or cancelled) jobs again"),
    "export": ("cli.export", "write a batch's results (.jsonl or .parquet)"),
    "usage": ("cli.usage", "model seconds and tokens by day, tenant and stage (and cost)"),
    "serve": ("cli.serve", "serve the HTTP API"),
    "keys": ("cli.keys", "create, list and revoke API keys"),
    "webhooks": ("cli.webhooks", "endpoints for events, the callback secret, deliveries"),
    "worker": ("cli.worker", "run a fast or slow worker of the distributed pipeline"),
    "workers": ("cli.workers", "fast and slow workers on this machine, restarted until Ctrl-C"),
    "models": (
        "cli.models",
        "build the tiny checkpoints or a random full-size one, train the synth models",
    ),
    "synth": ("cli.synth", "generate SpecEyes-Synth corpora"),
    "bench": ("cli.bench", "measure throughput (fast stage, agent, sandbox, runner, pipeline)"),
    "calibrate": (
        "cli.calibrate",
        "pick tau from a labelled batch, with a finite-sample guarantee",
    ),
    "report": ("cli.report", "accuracy and speedup per benchmark split (the paper's table)"),
    "audit": ("cli.audit", "the online audit: figures, and resuming after a drift alarm"),
    "db": ("cli.db", "job store schema (migrations)"),
    "config": ("cli.show_config", "print the effective settings"),
}


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for ``argv``: every command listed, the one ``argv`` names configured
    by its module, the others only named."""
    parser = argparse.ArgumentParser(
        prog="speceyes",
        description="SpecEyes: a speculative funnel in front of agentic vision-language "
        "models. A large agentic model screens each query, a small model answers the "
        "tool-free ones in batches, a confidence gate accepts or defers, and the rest run "
        "the large model's tool loop.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    add_commands(parser, COMMANDS, argv)
    return parser


def add_commands(
    parser: argparse.ArgumentParser,
    table: dict[str, tuple[str, str]],
    argv: Sequence[str],
    *,
    dest: str = "command",
    metavar: str = "COMMAND",
) -> None:
    """``table``'s commands under ``parser``, each named with its line of help; the one
    ``argv`` names is configured by its module: ``configure(parser)``, or, for a module
    with a ``COMMANDS`` table of its own (``speceyes bench KIND``), one level down."""
    commands = parser.add_subparsers(dest=dest, metavar=metavar, required=True)
    words = [arg for arg in argv if not arg.startswith("-")]
    for name, (module_name, line) in table.items():
        command = commands.add_parser(name, help=line)
        if words and name == words[0]:
            module = importlib.import_module(module_name)
            if hasattr(module, "COMMANDS"):
                command.description = module.DESCRIPTION
                add_commands(command, module.COMMANDS, words[1:], dest=name, metavar="KIND")
            else:
                module.configure(command)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = "-v" in argv or "--verbose" in argv
    if not verbose:  # before a command's module imports them: they read it at import
        _quiet_libraries()
    try:
        args = build_parser(argv).parse_args(argv)  # (imports the command: torch, seconds)
        handler = logging.StreamHandler()
        handler.setFormatter(TextFormatter())  # a record's fields too (common.logs)
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
        _few_malloc_arenas()
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except ConfigurationError as exc:
        print(f"speceyes: configuration error: {exc}", file=sys.stderr)
        return 2
    except InvalidInput as exc:  # bad usage: a missing SOURCE, an unknown id, ...
        print(f"speceyes: {exc}", file=sys.stderr)
        return 2
    except SpecEyesError as exc:
        print(f"speceyes: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("speceyes: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `speceyes config | head`: the reader has all it wants
        _silence_stdout()
        return 141  # as a shell reports a process ended by SIGPIPE
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises nothing more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _quiet_libraries() -> None:
    """transformers prints progress bars and advice on every load; keep the output ours."""

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")  # no retry chatter before our error
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _few_malloc_arenas() -> None:
    """Two malloc arenas, as MALLOC_ARENA_MAX=2 would (unless the operator set it).

    glibc gives each thread that allocates under contention an arena of its own and
    keeps what was freed there for that arena: threads that each decode one large image
    in turn (API uploads, fast batches, trajectories) would leave one image's worth of
    memory behind per thread, so the process grows with the thread count, not with the
    pixels decoded at once. With two arenas the freed memory is reused.
    """

    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl, ...): nothing to do
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX


if __name__ == "__main__":
    sys.exit(main())
