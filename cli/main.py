"""``speceyes``: the command line.

The CLI is the composition root: it reads the settings, loads what a command needs and
calls into ``common`` (and, for later commands, ``api`` or ``workers``). Heavy imports
(torch, transformers) happen inside the commands, so ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from common.errors import ConfigurationError, InvalidInput, SpecEyesError

EPILOG = """\
examples:
  speceyes models build-tiny                      build the tiny offline checkpoints
  speceyes annotate samples/manifest.jsonl --small synth --large synth
                                                  annotate the sample corpus (offline)
  speceyes ask IMAGE -q "What is the color of the circle?" --small synth --large synth
                                                  one query through the funnel, explained
  speceyes bench fast --batch-sizes 1,4,16,32     fast-stage throughput on tiny models
  speceyes config                                 the effective settings

Settings come from flags, then SPECEYES_* environment variables (see `speceyes config`).
"""


def build_parser() -> argparse.ArgumentParser:
    from cli import (
        annotate,
        ask,
        audit,
        bench,
        calibrate,
        db,
        export,
        jobs,
        keys,
        models,
        report,
        serve,
        show_config,
        synth,
        worker,
    )

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
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (
        annotate,
        ask,
        jobs,
        export,
        serve,
        keys,
        worker,
        models,
        synth,
        bench,
        calibrate,
        report,
        audit,
        db,
        show_config,
    ):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        _quiet_libraries()
    _few_malloc_arenas()
    try:
        return int(args.run(args) or 0)
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


def _quiet_libraries() -> None:
    """transformers prints progress bars and advice on every load; keep the output ours."""
    import os

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
    import contextlib
    import ctypes
    import os

    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl, ...): nothing to do
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX


if __name__ == "__main__":
    sys.exit(main())
