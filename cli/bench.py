"""``speceyes bench``: throughput figures, printed (never asserted by tests)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from cli.options import (
    add_broker_flags,
    add_model_flags,
    add_store_flags,
    flag_defaults,
    settings_from_args,
)

BOUND_HELP = (
    " Beside jobs/s, each run prints its overlap bound, jobs / max(fast stage busy, agents "
    "busy / agents), from the busy times the store recorded; the efficiency (measured / "
    "bound); the reference's serial loop on the same work; the gap to the bound in parts "
    "(the start, whole trajectories, the rest); and the run's draws replayed through the "
    "same schedule with no overhead at all (lab/schedule.py): the most any implementation "
    "of the schedule reaches on them, so what the run took beyond it is ours."
)


def register(commands: Any) -> None:
    parser = commands.add_parser("bench", help="measure throughput")
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    fast = kinds.add_parser(
        "fast",
        help="fast-stage (phases I-III) jobs/s against batch size",
        description="Run phases I-III over synthetic queries at each batch size and print "
        "jobs/s. Every job is screened AND speculated (the fast stage's worst case), so the "
        "figure does not depend on what a model happens to decide. Defaults to the tiny "
        "checkpoints on this machine.",
    )
    fast.add_argument(
        "--batch-sizes", default="1,4,16,32", help="comma-separated batch sizes (1,4,16,32)"
    )
    fast.add_argument("--jobs", type=int, default=64, help="jobs per batch size (64)")
    fast.add_argument("--image-size", default="640x480", help="synthetic image size WxH (640x480)")
    add_model_flags(fast)
    fast.set_defaults(run=run_fast, **flag_defaults(small_model="tiny", large_model="tiny"))

    embedded = kinds.add_parser(
        "embedded",
        help="the embedded runner's jobs/s: funnel against --baseline (simulated costs)",
        description="Annotate the same synthetic corpus twice with the embedded runner and "
        "the scripted backend at simulated costs: once through the funnel, once with "
        "--baseline (every job through the agent). Prints jobs/s of both, the measured "
        "speedup and the ideal 1/(1 - beta*alpha). The fast-stage cost is split evenly "
        "between screening and speculation." + BOUND_HELP,
    )
    embedded.add_argument("--jobs", type=int, default=200, help="corpus size (200)")
    embedded.add_argument("--tool-free", type=float, default=0.7, help="beta (0.7)")
    embedded.add_argument("--confident", type=float, default=0.7, help="alpha (0.7)")
    embedded.add_argument(
        "--fast-batch-s", type=float, default=0.2, help="fast stage s per batch (0.2)"
    )
    embedded.add_argument("--fast-job-s", type=float, default=0.01, help="... + s per job (0.01)")
    embedded.add_argument("--agent-s", type=float, default=1.0, help="agent s per trajectory (1.0)")
    embedded.add_argument("--batch-size", type=int, default=32, help="fast micro-batch (32)")
    embedded.add_argument("--agent-workers", type=int, default=1, help="agent threads (1)")
    embedded.set_defaults(run=run_embedded)

    agent = kinds.add_parser(
        "agent",
        help="trajectories/s of one agent worker against its concurrency (lockstep batching)",
        description="Run the same --trajectories DeepEyes trajectories (random images and "
        "questions; greedy) through the large model with N at once, for each N of "
        "--concurrency: N threads whose steps share one batched generate (lockstep). "
        "Prints trajectories/s, the speedup over N = 1 and the mean batch. Defaults to the "
        "tiny checkpoint on this machine; --large names any Qwen2.5-VL checkpoint.",
    )
    agent.add_argument("--concurrency", default="1,2,4,8", help="comma-separated N (1,2,4,8)")
    agent.add_argument("--trajectories", type=int, default=16, help="trajectories per N (16)")
    agent.add_argument("--steps", type=int, default=3, help="generations per trajectory (3)")
    agent.add_argument("--tokens", type=int, default=32, help="new tokens per step (32)")
    add_model_flags(agent)
    agent.set_defaults(run=run_agent, **flag_defaults(small_model="tiny", large_model="tiny"))

    sandbox = kinds.add_parser(
        "sandbox",
        help="the code sandbox's overhead per execution (Thyme), start to result",
        description="Run trivial and image-cropping programs through the code sandbox, "
        "the way a Thyme trajectory does (a spare guest process started during the "
        "model's step, --gap-s apart), and without the spare (a cold start each time). "
        "Prints the median and p90 milliseconds from handing over the code to the result. "
        "Target: well under the model's own time per step (< 100 ms here).",
    )
    sandbox.add_argument("--runs", type=int, default=20, help="executions per program (20)")
    sandbox.add_argument(
        "--isolation",
        choices=["bubblewrap", "gvisor", "none"],
        default="bubblewrap",
        help="what isolates the code (bubblewrap)",
    )
    sandbox.add_argument(
        "--gap-s", type=float, default=0.3, help="the model's time between executions (0.3)"
    )
    sandbox.set_defaults(run=run_sandbox)

    pipeline = kinds.add_parser(
        "pipeline",
        help="the distributed pipeline end to end: jobs/s and submit-to-done latency",
        description="Start fast and slow workers (scripted backend) on a scratch database "
        "beside --db (PostgreSQL) and a scratch key prefix on --broker, submit --jobs jobs "
        "in committed chunks, and print jobs/s from the first submit to the last result and "
        "the p50/p99 submit-to-done latency. By default the backend costs nothing, so the "
        "figure is the pipeline's own overhead (queues, batching, database). With "
        "--simulate, the embedded benchmark's costs apply and the funnel is compared with "
        "the baseline (every job through the slow pool) on the same workers." + BOUND_HELP,
    )
    pipeline.add_argument("--jobs", type=int, help="jobs (10000; 200 with --simulate)")
    pipeline.add_argument("--fast-workers", type=int, default=1, help="fast workers (1)")
    pipeline.add_argument("--slow-workers", type=int, default=1, help="slow workers (1)")
    pipeline.add_argument("--batch-size", type=int, default=32, help="fast micro-batch (32)")
    pipeline.add_argument(
        "--tool-free",
        type=float,
        help="beta: share screened tool-free (1.0: every job stays in the fast pool, the "
        "pipeline's own ceiling; 0.7 with --simulate)",
    )
    pipeline.add_argument(
        "--confident", type=float, help="alpha: share accepted (1.0; 0.7 with --simulate)"
    )
    pipeline.add_argument(
        "--simulate",
        action="store_true",
        help="simulated costs (below); funnel vs baseline",
    )
    pipeline.add_argument(
        "--fast-batch-s", type=float, default=0.2, help="--simulate: fast s per batch (0.2)"
    )
    pipeline.add_argument("--fast-job-s", type=float, default=0.01, help="... + s per job (0.01)")
    pipeline.add_argument("--agent-s", type=float, default=1.0, help="agent s per trajectory (1.0)")
    add_store_flags(pipeline)
    add_broker_flags(pipeline)
    pipeline.set_defaults(run=run_pipeline)

    synth = kinds.add_parser(
        "synth",
        help="the SpecEyes-Synth report: accuracy, gates, speedup (trained tiny models)",
        description="On a held-out synth set, with the shipped synth models: small-only, "
        "agent-only and funnel accuracy; beta and alpha; the embedded runner's jobs/s "
        "against --baseline; accepted vs rejected accuracy of each gate at tau 0.97 and "
        "0.98; a PNG of accuracy and speedup against tau.",
    )
    synth.add_argument("--items", type=int, default=160, help="held-out items (160)")
    synth.add_argument("--seed", type=int, default=99, help="held-out seed (99)")
    synth.add_argument("--plot", type=Path, default=Path("synth-report.png"))
    synth.add_argument("--json", type=Path, help="also write the figures as JSON")
    synth.add_argument(
        "--threshold",
        type=float,
        metavar="TAU",
        help="the funnel run's gate threshold (min gate; default 0.98, or "
        "SPECEYES_GATE_THRESHOLD); the gate table shows 0.97 and 0.98 whatever it is",
    )
    add_model_flags(synth)
    synth.set_defaults(run=run_synth, **flag_defaults(small_model="synth", large_model="synth"))


def run_fast(args: argparse.Namespace) -> int:
    from common.backends import load_models
    from common.funnel import gate_stage, screen_stage, speculate_stage
    from lab.bench import synthetic_queries

    settings = settings_from_args(args)
    sizes = [int(size) for size in args.batch_sizes.split(",")]
    width, height = (int(side) for side in args.image_size.lower().split("x"))
    models = load_models(settings)
    queries = synthetic_queries(args.jobs, width, height)
    # Warm-up: first calls pay one-off costs (allocations, kernel selection).
    screen_stage(queries[:2], models.large, max_new_tokens=settings.funnel.screen_max_new_tokens)
    speculate_stage(queries[:2], models.small, max_new_tokens=4, top_k=settings.funnel.gate.top_k)

    device = getattr(models.large, "device", "-")
    print(
        f"fast stage on {settings.models.large.name} (screen) + "
        f"{settings.models.small.name} (speculate), "
        f"{args.jobs} jobs of {width}x{height}, device {device}"
    )
    print(f"{'batch':>5} {'screen s':>9} {'speculate s':>12} {'gate s':>7} {'jobs/s':>8}")
    for size in sizes:
        seconds = {"screen": 0.0, "speculate": 0.0, "gate": 0.0}
        for start in range(0, len(queries), size):
            batch = queries[start : start + size]
            began = time.perf_counter()
            screen_stage(batch, models.large, max_new_tokens=settings.funnel.screen_max_new_tokens)
            seconds["screen"] += time.perf_counter() - began
            began = time.perf_counter()
            answers = speculate_stage(
                batch,
                models.small,
                max_new_tokens=settings.funnel.speculate_max_new_tokens,
                top_k=settings.funnel.gate.top_k,
            )
            seconds["speculate"] += time.perf_counter() - began
            began = time.perf_counter()
            gate_stage([a for a in answers if not isinstance(a, Exception)], settings.funnel.gate)
            seconds["gate"] += time.perf_counter() - began
        total = sum(seconds.values())
        print(
            f"{size:>5} {seconds['screen']:>9.2f} {seconds['speculate']:>12.2f} "
            f"{seconds['gate']:>7.3f} {len(queries) / total:>8.1f}"
        )
    return 0


def run_embedded(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from common.backends.scripted import ScriptedSettings
    from common.config import Settings
    from lab.bench import bench_embedded, write_corpus
    from lab.schedule import Schedule

    scripted = ScriptedSettings(
        tool_free=args.tool_free,
        confident=args.confident,
        fast_batch_s=args.fast_batch_s,
        fast_job_s=args.fast_job_s,
        agent_step_s=args.agent_s,
    )
    print(
        f"embedded runner, scripted backend, {args.jobs} jobs: fast stage {args.fast_batch_s} s "
        f"per batch + {args.fast_job_s} s per job (batch {args.batch_size}), agent "
        f"{args.agent_s} s per trajectory, {args.agent_workers} agent worker(s)"
    )
    schedule = Schedule(
        args.batch_size, args.fast_batch_s, args.fast_job_s, args.agent_s, args.agent_workers
    )
    figures = {}
    with tempfile.TemporaryDirectory() as scratch:
        corpus = Path(scratch) / "corpus"
        write_corpus(corpus, args.jobs)
        for label, is_baseline in (("funnel", False), ("baseline", True)):
            settings = Settings(
                backend="scripted",
                baseline=is_baseline,
                audit_rate=0.0,  # the funnel's own speed (the audit's cost is its rate)
                fast_batch_size=args.batch_size,
                agent_workers=args.agent_workers,
            )
            url = f"sqlite:///{Path(scratch) / label}.db"
            figures[label] = bench_embedded(settings, corpus, url, scripted)
            run = figures[label]
            print(
                f"{label:<9} {run.jobs} jobs in {run.seconds:7.1f} s = {run.jobs_per_s:6.2f} "
                f"jobs/s   answered by the small model: {run.small_share:.1%}"
            )
            _print_bound(run, schedule)
    funnel, baseline = figures["funnel"], figures["baseline"]
    beta, alpha = funnel.beta or 0.0, funnel.alpha or 0.0
    print(f"measured  beta {beta:.3f}, alpha {alpha:.3f}")
    print(
        f"speedup   {funnel.jobs_per_s / baseline.jobs_per_s:.2f}x measured, "
        f"{1 / (1 - beta * alpha):.2f}x ideal 1/(1 - beta*alpha)"
    )
    return 0


def run_pipeline(args: argparse.Namespace) -> int:
    from lab.pipeline_bench import PipelinePlan, bench_pipeline
    from lab.schedule import Schedule

    settings = settings_from_args(args, fast_batch_size=args.batch_size)
    jobs = args.jobs or (200 if args.simulate else 10_000)
    share = 0.7 if args.simulate else 1.0
    beta = share if args.tool_free is None else args.tool_free
    alpha = share if args.confident is None else args.confident
    shares = {"SPECEYES_SCRIPTED__TOOL_FREE": str(beta), "SPECEYES_SCRIPTED__CONFIDENT": str(alpha)}
    if args.simulate:
        shares |= {
            "SPECEYES_SCRIPTED__FAST_BATCH_S": str(args.fast_batch_s),
            "SPECEYES_SCRIPTED__FAST_JOB_S": str(args.fast_job_s),
            "SPECEYES_SCRIPTED__AGENT_STEP_S": str(args.agent_s),
        }
    runs = [("funnel", False), ("baseline", True)] if args.simulate else [("funnel", False)]
    costs = (args.batch_size, args.fast_batch_s, args.fast_job_s, args.agent_s)
    schedule = Schedule(*costs, args.slow_workers) if args.simulate else None
    cost = "simulated costs" if args.simulate else "zero-cost scripted backend"
    print(
        f"distributed pipeline, {cost}, {jobs} jobs, beta {beta} x alpha "
        f"{alpha}, {args.fast_workers} fast / {args.slow_workers} slow worker(s), "
        f"batch {args.batch_size}"
    )
    results = {}
    for label, baseline in runs:
        plan = PipelinePlan(
            jobs,
            args.fast_workers,
            args.slow_workers,
            worker_env={**shares, "SPECEYES_BASELINE": str(baseline).lower()},
        )
        results[label] = figures = bench_pipeline(settings, plan, log=lambda line: None)
        print(
            f"{label:<9} {figures.jobs} jobs in {figures.seconds:.1f} s = "
            f"{figures.jobs_per_s:.1f} jobs/s; submit-to-done p50 {figures.p50_s:.2f} s, "
            f"p99 {figures.p99_s:.2f} s; small model answered {figures.small_share:.1%}"
        )
        _print_bound(figures, schedule)
    if args.simulate:
        funnel, base = results["funnel"], results["baseline"]
        beta, alpha = funnel.beta or 0.0, funnel.alpha or 0.0
        print(
            f"speedup   {funnel.jobs_per_s / base.jobs_per_s:.2f}x "
            f"(ideal 1/(1 - beta*alpha) = {1 / (1 - beta * alpha):.2f}x "
            f"at the drawn beta {beta:.3f}, alpha {alpha:.3f})"
        )
    return 0


def run_synth(args: argparse.Namespace) -> int:
    from common.backends import load_models
    from lab.synth.report import format_report, run_report, save

    settings = settings_from_args(args)
    models = load_models(settings)
    report = run_report(
        models,
        settings,
        count=args.items,
        seed=args.seed,
        plot_path=args.plot,
        on_log=lambda line: print(line, flush=True),
    )
    print(format_report(report))
    if args.json:
        save(report, args.json)
    return 0


def run_sandbox(args: argparse.Namespace) -> int:
    import statistics

    from PIL import Image

    from common.sandbox import Sandbox, probe_request

    sandbox = Sandbox(isolation=args.isolation)
    sandbox.check()
    crop = (
        "from PIL import Image\nimage = Image.open(image_path)\n"
        "processed_path = '/mnt/data/out/crop.png'\n"
        "image.crop((100, 100, 400, 300)).save(processed_path)\nprint(processed_path)"
    )
    programs = {"print(1)": "print(1)", "crop 640x480": crop}

    def figures(label: str, seconds: list[float]) -> None:
        ms = sorted(1000 * s for s in seconds)
        p90 = ms[int(0.9 * (len(ms) - 1))]
        print(f"  {label:<28} median {statistics.median(ms):6.1f} ms   p90 {p90:6.1f} ms")

    print(f"sandbox overhead per execution ({args.runs} runs each, {sandbox.isolation})")
    for name, code in programs.items():
        timings: dict[bool, list[float]] = {True: [], False: []}
        for spare in (True, False):
            with sandbox.session(spare=spare) as session:
                request = {**probe_request(session), "code": code}
                Image.new("RGB", (640, 480), (90, 120, 200)).save(session.folder / "image.jpg")
                for _ in range(args.runs):
                    time.sleep(args.gap_s)  # the model's step: the spare starts meanwhile
                    execution = session.run(request)
                    report = execution.report
                    if report is None or not (report.images or report.text):
                        raise SystemExit(f"{name}: {execution}")
                    timings[spare].append(execution.seconds)
        figures(f"{name}, spare started ahead", timings[True])
        figures(f"{name}, cold start", timings[False])
    return 0


def run_agent(args: argparse.Namespace) -> int:
    from PIL import Image, ImageDraw

    from common.backends.lockstep import Lockstep
    from common.backends.transformers_backend import TransformersModel
    from common.config import AgentSettings
    from common.contracts import Query
    from common.funnel import run_agent_stage
    from common.models.registry import protocol_name, resolve_model
    from common.protocols import get_protocol

    settings = settings_from_args(args)
    path = resolve_model(settings.models.large.name, "large", settings.models.cache_dir)
    protocol = get_protocol(
        protocol_name(settings.models.large.name, "large", settings.models.protocol)
    )
    model = TransformersModel(
        path, device=settings.models.device, dtype=settings.models.dtype, protocol=protocol
    )
    limits = AgentSettings(max_steps=args.steps, max_new_tokens=args.tokens)
    queries = []
    for index in range(args.trajectories):
        image = Image.new("RGB", (448, 336), (index * 13 % 256, 80, 160))
        ImageDraw.Draw(image).ellipse((40 + index, 30, 200, 180), fill=(250, 250, 250))
        queries.append(Query(f"b{index}", image, f"What is at spot {index}?", ("a", "b")))
    print(
        f"agent: {args.trajectories} trajectories x {args.steps} steps x {args.tokens} "
        f"tokens, {settings.models.large.name} on {model.device}"
    )
    run_agent_stage(queries[0], model, AgentSettings(max_steps=1, max_new_tokens=2))  # warm up
    base = None
    for n in (int(part) for part in args.concurrency.split(",")):
        engine = Lockstep(model, max_batch=n, max_wait_s=1.0) if n > 1 else model
        started = time.perf_counter()
        _run_concurrently(engine, queries, n, limits)
        rate = args.trajectories / (time.perf_counter() - started)
        base = base or rate
        sizes = engine.batch_sizes if isinstance(engine, Lockstep) else [1]
        mean = sum(sizes) / max(1, len(sizes))
        print(
            f"  N = {n:<3} {rate:7.2f} trajectories/s   x{rate / base:5.2f}   "
            f"mean batch {mean:4.1f}"
        )
    return 0


def _run_concurrently(engine: Any, queries: list[Any], threads: int, limits: Any) -> None:
    """Every query's trajectory, ``threads`` at a time."""
    import threading

    from common.funnel import run_agent_stage

    pending = list(queries)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                query = pending.pop()
            run_agent_stage(query, engine, limits)

    running = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()


def _print_bound(run: Any, schedule: Any = None) -> None:
    """The overlap bound of a run, its efficiency, and the reference's serial loop; with
    the simulated costs (``schedule``), what an overhead-free run of the same draws takes
    (``lab.schedule``)."""
    print(
        f"          bound {run.bound_jobs_per_s:6.2f} jobs/s (fast busy {run.fast_busy_s:.1f} s, "
        f"agents busy {run.agent_busy_s:.1f} s / {run.agent_workers}), efficiency "
        f"{run.efficiency:.2f}; the reference's serial loop on the same work "
        f"{run.serial_jobs_per_s:.2f} jobs/s"
    )
    if run.agents_bound and run.efficiency < 1:
        gap = run.seconds - run.agent_busy_s / run.agent_workers
        print(
            f"          gap to the bound {gap:.1f} s: {run.fill_s:.1f} s before the first "
            f"trajectory (a screen must come first), {run.tail_s:.1f} s whole trajectories "
            f"({run.agent_jobs} on {run.agent_workers} agent(s)), "
            f"{gap - run.fill_s - run.tail_s:.1f} s the rest"
        )
    if schedule is not None and run.draws:
        from lab.schedule import overhead_free

        ideal = overhead_free(run.draws, schedule)
        print(
            f"          the same draws with no overhead at all: {ideal.seconds:.1f} s, "
            f"efficiency {ideal.efficiency:.3f} (the start and whole trajectories); this run "
            f"took {run.seconds - ideal.seconds:.1f} s more"
        )
