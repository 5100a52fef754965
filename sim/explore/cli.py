"""Subcommands that explore many scenarios: compare, sweep, plan.

Every command writes into ``--out DIR`` (default a folder under ``results/``): its CSV, charts and a
self-contained ``report.html``. User mistakes raise ScenarioError, which ``sim.cli`` prints as one line
(exit 2).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from sim.errors import ScenarioError
from sim.explore.runner import EXECUTORS, default_workers
from sim.outputs.writers import atomic_write_text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number ≥ 1, got {value}")
    return value


def _gpu_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU counts like 512 or 512,1024, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive GPU counts, got {text!r}")
    return values


def _common(p: argparse.ArgumentParser, charts: bool = True) -> None:
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key in every scenario, e.g. training.global_batch=1024 (repeatable)",
    )
    p.add_argument("--out", help="result folder (default: a folder under results/)")
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        help=f"parallel simulations (local processes; default min(CPUs, 4) = {default_workers()})",
    )
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="local worker processes (default) or Ray tasks (needs `pip install ray`)",
    )
    p.add_argument("--address", help="Ray cluster address for --executor ray (default: start a local Ray)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    if charts:
        p.add_argument("--no-charts", action="store_true", help="skip the PNG/SVG charts")


def _check_executor(args: argparse.Namespace) -> None:
    if args.address and args.executor != "ray":
        raise ScenarioError(
            "--address is for --executor ray; add --executor ray or drop --address", "--address"
        )


def _slug(text: str, limit: int = 80) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:limit] or "run"


def _finish(out: Path) -> None:
    from sim.outputs.report import write_report

    report = write_report(out)
    print(f"{'results':<10} {out}/ (report: {report})")


def cmd_compare(args: argparse.Namespace) -> int:
    from sim.explore.compare import compare, compare_table, write_compare

    _check_executor(args)
    if len(args.scenarios) < 2:
        raise ScenarioError("compare needs at least two scenario files", "compare")
    rows = compare(
        args.scenarios,
        args.set,
        workers=args.workers,
        executor=args.executor,
        address=args.address,
        progress=not args.no_progress,
    )
    out = (
        Path(args.out)
        if args.out
        else Path("results") / _slug("compare-" + "-vs-".join(r["label"] for r in rows))
    )
    write_compare(rows, out, charts=not args.no_charts)
    table = compare_table(rows)
    atomic_write_text(out / "compare.txt", table + "\n")
    print(table)
    _finish(out)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from sim.explore.sweep import NO_FIT, OK, counts, sweep, sweep_text, write_sweep
    from sim.scenario.load import read_scenario_file

    _check_executor(args)
    rows = sweep(
        args.scenario,
        args.grid,
        args.set,
        fit_data=args.fit_data,
        workers=args.workers,
        executor=args.executor,
        address=args.address,
        progress=not args.no_progress,
    )
    keys = [g.partition("=")[0].strip() for g in args.grid]
    name = read_scenario_file(args.scenario).get("name", Path(args.scenario).stem)
    out = Path(args.out) if args.out else Path("results") / _slug(f"sweep-{name}")
    write_sweep(rows, keys, out, charts=not args.no_charts, title=f"sweep of {name}")
    text = sweep_text(rows, keys)
    atomic_write_text(out / "sweep.txt", text + "\n")
    print(text)
    _finish(out)
    n = counts(rows)
    if n[OK] + n[NO_FIT] == 0:
        raise ScenarioError(
            f"no point of the sweep could be simulated (first reason: {rows[0]['reason']})", "--grid"
        )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from sim.explore.plan import plan, plan_text, write_plan

    _check_executor(args)
    result = plan(
        args.scenario,
        args.set,
        gpus=args.gpus,
        objective=args.objective,
        top=args.top,
        workers=args.workers,
        executor=args.executor,
        address=args.address,
        progress=not args.no_progress,
        max_micro_batch=args.max_micro_batch,
    )
    out = Path(args.out) if args.out else Path("results") / _slug(f"plan-{result.name}")
    text = plan_text(result, args.workers)
    print(text)
    if result.winner is None:
        raise ScenarioError(
            "no candidate fits in memory and simulates; try more GPUs (--gpus) or a smaller global batch",
            "plan",
        )
    files = write_plan(result, out)
    atomic_write_text(out / "plan.txt", text + "\n")
    if out / "best.yaml" in files:
        print(f"{'best':<10} {out / 'best.yaml'} (run it: dtsim run {out / 'best.yaml'})")
    _finish(out)
    return 0


def add_explore_commands(sub) -> None:
    """Register compare, sweep and plan on the ``dtsim`` sub-parser collection."""
    c = sub.add_parser(
        "compare",
        help="simulate several scenarios and compare them side by side",
        description="Simulate each scenario (same --set overrides) and print a side-by-side table; "
        "writes compare.csv, compare.png/svg and report.html.",
    )
    c.add_argument("scenarios", nargs="+", help="scenario YAML files (two or more)")
    _common(c)
    c.set_defaults(func=cmd_compare)

    s = sub.add_parser(
        "sweep",
        help="simulate the cartesian product of parameter grids",
        description="Simulate BASE with every combination of the --grid values, in parallel. Invalid points "
        "and points that do not fit in memory are listed with the reason, not dropped. "
        "Fit data (default): when a grid changes tensor, pipeline or the cluster size but not "
        "parallel.data, data is recomputed as GPUs/(tensor×pipeline) to keep the GPU count.",
    )
    s.add_argument("scenario", help="base scenario YAML")
    s.add_argument(
        "--grid",
        action="append",
        default=[],
        required=True,
        metavar="KEY=V1,V2,…",
        help="a key and its values (YAML each), e.g. parallel.tensor=1,2,4,8 (repeatable)",
    )
    s.add_argument(
        "--fit-data",
        dest="fit_data",
        action="store_true",
        default=True,
        help="recompute parallel.data = GPUs/(tensor×pipeline) for each point (default)",
    )
    s.add_argument(
        "--no-fit-data",
        dest="fit_data",
        action="store_false",
        help="keep parallel.data as given (points whose product ≠ GPUs become invalid)",
    )
    _common(s)
    s.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "plan",
        help="search data/tensor/pipeline layouts and settings for a transformer",
        description="Search data, tensor and pipeline degrees, micro-batch, schedule, ZeRO, checkpointing "
        "and "
        "sequence parallelism; screen them with closed forms, simulate the best --top and the given "
        "configuration, and explain the winner. The global batch and precision stay as given; the GPU "
        "count is the cluster's unless --gpus is given.",
    )
    p.add_argument("scenario", help="base scenario YAML (a transformer model)")
    p.add_argument(
        "--gpus",
        type=_gpu_list,
        default=None,
        metavar="N[,N…]",
        help="GPU count(s) to plan for (nodes = N / gpus_per_node); default: the cluster's",
    )
    p.add_argument(
        "--objective",
        choices=("throughput", "cost", "time-to-train"),
        default="throughput",
        help="rank by tokens/s (default), $ per 1M tokens, or days to train",
    )
    p.add_argument("--top", type=_positive_int, default=3, help="candidates to simulate (default 3)")
    p.add_argument(
        "--max-micro-batch", type=_positive_int, default=8, help="largest micro-batch tried (default 8)"
    )
    _common(p, charts=False)
    p.set_defaults(func=cmd_plan)
