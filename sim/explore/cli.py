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
from sim.explore.runner import EXECUTORS, NO_FIT, OK, default_workers
from sim.outputs.writers import atomic_write_text

# Lazy imports in the cmd_* functions and helpers below: sim.cli imports this module to build the parser of
# every command, so each subcommand loads only what it runs (the simulator, pydantic schema, planner, report
# writer: together ≈ 0.8 s that `dtsim --help`, `run` and `plot` would otherwise pay).

MAX_PLAN_GPUS = 10**13  # far beyond any cluster; keeps factorising the count instant


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number ≥ 1, got {value}")
    return value


def path_text(text: str) -> str:
    """A path option's value: not empty (an empty --out would silently fall back to the default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty value (leave the option out for its default)")
    return text


def _gpu_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU counts like 512 or 512,1024, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive GPU counts, got {text!r}")
    if any(v > MAX_PLAN_GPUS for v in values):
        raise argparse.ArgumentTypeError(f"expected GPU counts up to {MAX_PLAN_GPUS:.0e}, got {text!r}")
    return values


def _common(p: argparse.ArgumentParser, charts: bool = True) -> None:
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key in every scenario, e.g. training.global_batch=1024 (repeatable)",
    )
    p.add_argument("--out", type=path_text, help="result folder (default: a folder under results/)")
    p.add_argument(
        "--workers",
        type=positive_int,
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


def _finish(staging: Path, out: Path) -> None:
    from sim.outputs.report import write_report

    write_report(staging, out)


def _done(out: Path) -> None:
    print(f"{'results':<10} {out}/ (report: {out / 'report.html'})")


def _name_of(path: str) -> str:
    """A scenario file's name (for a default result folder), read before any work."""
    from sim.scenario.load import read_scenario_file

    name = read_scenario_file(path).get("name")
    return str(name) if isinstance(name, str) and name else Path(path).stem


def cmd_compare(args: argparse.Namespace) -> int:
    from sim.budget import check_budget
    from sim.explore.compare import compare, compare_table, unique_labels, write_compare
    from sim.outputs.resultdir import ResultDir
    from sim.scenario.load import load_scenario

    _check_executor(args)
    if len(args.scenarios) < 2:
        raise ScenarioError(f"got {len(args.scenarios)} scenario file ({', '.join(args.scenarios)}); give two or more "
                            "to compare (e.g. dtsim compare a.yaml b.yaml)", "compare")
    for path in args.scenarios:  # every file valid and of bounded size before anything runs
        try:
            check_budget(load_scenario(path, args.set), flag=None, announce=False)
        except ScenarioError as exc:
            raise ScenarioError(f"{path}: {exc}") from None
    labels = unique_labels([_name_of(p) for p in args.scenarios])
    out = Path(args.out) if args.out else Path("results") / _slug(
        "compare-" + "-vs-".join(re.sub(r"^compare-", "", label) for label in labels)
    )
    with ResultDir(out, "compare") as staging:
        rows = compare(
            args.scenarios,
            args.set,
            workers=args.workers,
            executor=args.executor,
            address=args.address,
            progress=not args.no_progress,
        )
        write_compare(rows, staging, charts=not args.no_charts)
        table = compare_table(rows)
        atomic_write_text(staging / "compare.txt", table + "\n")
        _finish(staging, out)
    print(table)
    _done(out)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from sim.explore.sweep import counts, sweep, sweep_text, write_sweep
    from sim.outputs.resultdir import ResultDir

    _check_executor(args)
    keys = [g.partition("=")[0].strip() for g in args.grid]
    for item in args.set:  # the grid's value would win unseen: say so instead
        key = item.partition("=")[0].strip()
        if key in keys:
            raise ScenarioError(f"--set {item} and --grid {key}=… give the same key; the grid sets it for every "
                                f"point, so drop the --set (or add its value to the grid)", "--set")
    name = _name_of(args.scenario)
    out = Path(args.out) if args.out else Path("results") / _slug(f"sweep-{name}")
    with ResultDir(out, "sweep") as staging:
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
        n = counts(rows)
        if n[OK] + n[NO_FIT] == 0:
            raise ScenarioError(
                f"no point of the sweep could be simulated (first reason: {rows[0]['reason']})", "--grid"
            )
        write_sweep(rows, keys, staging, charts=not args.no_charts, title=f"sweep of {name}")
        text = sweep_text(rows, keys)
        atomic_write_text(staging / "sweep.txt", text + "\n")
        _finish(staging, out)
    print(text)
    _done(out)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from sim.explore.plan import DEFAULT_TOP, plan
    from sim.explore.plan_output import plan_text, write_plan
    from sim.outputs.resultdir import ResultDir

    _check_executor(args)
    out = Path(args.out) if args.out else Path("results") / _slug(f"plan-{_name_of(args.scenario)}")
    with ResultDir(out, "plan") as staging:
        result = plan(
            args.scenario,
            args.set,
            gpus=args.gpus,
            objective=args.objective,
            top=DEFAULT_TOP if args.top is None else args.top,
            workers=args.workers,
            executor=args.executor,
            address=args.address,
            progress=not args.no_progress,
            max_micro_batch=args.max_micro_batch,
        )
        text = plan_text(result, args.workers)
        if result.winner is None:
            print(text)
            raise ScenarioError(no_winner_advice(args, result), "plan")
        files = write_plan(result, staging)
        atomic_write_text(staging / "plan.txt", text + "\n")
        _finish(staging, out)
    print(text)
    if staging / "best.yaml" in files:
        print(f"{'best':<10} {out / 'best.yaml'} (run it: dtsim run {out / 'best.yaml'})")
    _done(out)
    return 0


MAX_ADVISED_GPUS = 100_000  # beyond this, "try more GPUs" is no advice


def no_winner_advice(args: argparse.Namespace, result) -> str:
    """Why no plan candidate won, with advice that fits the GPU counts asked for. When the simulated
    candidates all failed for one reason other than memory (an event budget, a setting of the base
    scenario), that reason is the advice: more GPUs would not help."""
    counts = list(getattr(result, "gpu_counts", None) or args.gpus or [])
    base = getattr(result, "base", None)
    rows = list(getattr(result, "rows", None) or [])
    failed = [r for r in rows if r.get("status") not in (OK, NO_FIT)]
    if rows and len(failed) == len(rows):
        kinds = {str(r.get("reason") or "").split(":", 1)[0] for r in failed}  # the field each names
        first = str(failed[0].get("reason") or "no reason given")
        return (f"no candidate simulates: {first}" + ("" if len(kinds) == 1 else
                f" (other candidates fail on {len(kinds) - 1} other field(s): see the table above)"))
    if base is not None and counts:
        largest_layout = base.training.global_batch * base.cluster.gpus_per_node * base.model.layers
        if min(counts) > largest_layout:  # data ≤ batch, tensor ≤ GPUs per node, pipeline ≤ layers
            return (
                f"no layout uses {min(counts):,} GPUs: data × tensor × pipeline is at most global batch × "
                f"GPUs per node × layers = {largest_layout:,}; plan for fewer GPUs (--gpus) or set a larger "
                "training.global_batch"
            )
    if counts and max(counts) >= MAX_ADVISED_GPUS:
        return (
            f"no candidate fits in memory and simulates, even on {max(counts):,} GPUs; use a smaller model, "
            "GPUs with more memory, or another global batch"
        )
    return "no candidate fits in memory and simulates; try more GPUs (--gpus) or a smaller global batch"


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
    fit = s.add_mutually_exclusive_group()
    fit.add_argument(
        "--fit-data",
        dest="fit_data",
        action="store_true",
        default=True,
        help="recompute parallel.data = GPUs/(tensor×pipeline) for each point (default)",
    )
    fit.add_argument(
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
        "sequence parallelism; screen them with closed forms, simulate the best --top (and those the "
        "screen cannot tell from the best) and the given "
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
    p.add_argument("--top", type=positive_int, default=None,
                   help="candidates to simulate (default 3, sim.explore.plan.DEFAULT_TOP), and on, up to twice "
                        "as many, while the estimates lie within the screen's 1.5 %% error of the best")
    p.add_argument(
        "--max-micro-batch", type=positive_int, default=8, help="largest micro-batch tried (default 8)"
    )
    _common(p, charts=False)
    p.set_defaults(func=cmd_plan)
