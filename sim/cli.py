"""dtsim command line: run | compare | sweep | plan | plot | calibrate | validate [--published] | schema.

User mistakes (ScenarioError) print one line and exit 2; a failed simulation (e.g. a deadlock) exits 1.
The subcommands import their modules inside the function, for start-up speed: each command loads only what
it needs (the simulator, matplotlib, torch are heavy).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from sim.errors import ScenarioError, SimulationError
from sim.units import format_days, format_hours, format_seconds

if TYPE_CHECKING:
    from sim.summary import Summary


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as a ScenarioError (one line, exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ScenarioError(f"{message}; see `{self.prog} --help`", "command line")


def summary_table(s: Summary) -> str:
    """The human-readable summary printed by ``dtsim run``."""
    rows: list[tuple[str, str]] = [("scenario", s.name)]
    if s.workload == "collective":
        rows.append(("collective", f"{s.op} ({s.algorithm}) on {s.num_gpus} GPUs"))
        lines = [f"{k:<22} {v}" for k, v in rows]
        lines.append(f"{'size (B)':>14} {'time':>12} {'algbw GB/s':>12} {'busbw GB/s':>12}")
        for r in s.collectives or []:
            lines.append(f"{r['size_bytes']:>14} {format_seconds(r['time_s']):>12} {r['algbw_GBps']:>12.2f} "
                         f"{r['busbw_GBps']:>12.2f}")
        return "\n".join(lines)
    par = s.parallel or {}
    rows += [
        ("GPUs", f"{s.num_gpus} (data {par.get('data')} × tensor {par.get('tensor')} × pipeline "
                 f"{par.get('pipeline')}"
                 + (f" × context {par['context']} ({par['context_attention']})" if par.get("context") else "")
                 + (f", expert {par['expert']} of data" if par.get("expert") else "")
                 + f", {par.get('schedule')}, ZeRO {par.get('zero')})"),
        ("step time", format_seconds(s.step_time_s)),
        ("throughput", f"{s.samples_per_s:.2f} samples/s"
                       + (f", {s.tokens_per_s:.4g} tokens/s" if s.workload == "transformer" else "")),
        *([("step time p50/p90/p99", f"{format_seconds(s.step_time_p50_s)} / {format_seconds(s.step_time_p90_s)} / "
                                      f"{format_seconds(s.step_time_p99_s)} over {len(s.step_times_s or [])} steps")]
          if s.step_time_p50_s is not None and s.step_time_p90_s is not None and s.step_time_p99_s is not None
          else []),
        ("compute / step", format_seconds(s.compute_s)),
        ("exposed comm / step", format_seconds(s.exposed_comm_s)),
        ("bubble (idle) fraction", f"{s.bubble_fraction:.1%}"),
        ("pipeline utilisation", f"{s.pipeline_utilisation:.1%}"),
    ]
    lt = s.layer_time_s
    if lt:
        rows.append(("one layer", f"forward {format_seconds(lt['forward_s'])}, backward "
                                  f"{format_seconds(lt['backward_s'])}"
                                  + (f" (recompute {format_seconds(lt['recompute_s'])})" if lt["recompute_s"] else "")
                                  + (f"; TP comm {format_seconds(lt['tp_comm_forward_s'])} + "
                                     f"{format_seconds(lt['tp_comm_backward_s'])}"
                                     if lt["tp_comm_forward_s"] or lt["tp_comm_backward_s"] else "")
                                  + f" (GPU {lt['gpu']:.0f}, micro-batch {lt['microbatch']:.0f})"))
    if s.slowest_gpu_factor is not None and s.gpu_speed_spread:
        rows.append(("GPU speed spread", f"σ {s.gpu_speed_spread:.2%}: the slowest of {s.num_gpus} GPUs computes "
                                         f"×{s.slowest_gpu_factor:.3f} (cluster.gpu_speed_spread: 0 for identical GPUs)"))
    if s.mfu is not None and s.hfu is not None:
        rows.append(("MFU (model FLOPs)", f"{s.mfu:.1%} ({s.model_tflops_per_gpu:.1f} TFLOP/s per GPU)"))
        rows.append(("HFU (with recompute)", f"{s.hfu:.1%} ({s.hardware_tflops_per_gpu:.1f} TFLOP/s per GPU)"))
    if s.speedup is not None and s.efficiency is not None:
        rows.append(("speedup / efficiency", f"{s.speedup:.2f}× / {s.efficiency:.1%} "
                                             f"(overhead {s.overhead_gpu_s:.4g} GPU·s)"))
    mb = s.memory_bytes
    if mb:
        fit = "fits" if s.fits_in_memory else (
            f"DOES NOT FIT: {mb['peak'] / 1e9:.1f} GB > {(s.gpu_memory_bytes or 0.0) / 1e9:.0f} GB "
            f"(+{(s.memory_over_bytes or 0.0) / 1e9:.1f} GB)")
        rows.append(("peak memory / GPU", f"{mb['peak'] / 1e9:.2f} GB (stage {mb['stage']}) — {fit}"))
        if not s.fits_in_memory and s.memory_fixes:
            rows.append(("to make it fit", "; ".join(s.memory_fixes[:3])))
    if s.cost_per_step_usd is not None:
        c = f"${s.cost_per_step_usd:.4g}/step"
        if s.cost_per_1M_tokens_usd is not None:
            c += f", ${s.cost_per_1M_tokens_usd:.4g}/1M tokens"
        rows.append(("cost", c))
    if s.time_to_train_days is not None:
        rows.append(("time to train", f"{format_days(s.time_to_train_days)}, "
                                      f"${s.cost_to_train_usd:,.0f}, {s.energy_to_train_MWh:.1f} MWh"))
    rel = s.reliability
    if rel:
        mc = rel.get("monte_carlo")
        mc_txt = (f"; Monte-Carlo {mc['wall_s'] / 86400:.2f} ± {mc['wall_ci95_s'] / 86400:.2f} days"
                  if mc and "wall_s" in mc else "")
        rows.append(("with failures", f"{rel['expected_time_to_train_days']:.2f} days, goodput "
                                      f"{rel['goodput']:.1%}, ${rel['effective_cost_usd']:,.0f}{mc_txt}"))
        rows.append(("checkpoints", f"every {rel['interval_steps']} steps ({format_seconds(rel['interval_s'])}; "
                                    f"optimum {format_seconds(rel['optimal_interval_s'])}), "
                                    f"{format_seconds(rel['checkpoint_blocking_s'])} each; job MTBF "
                                    f"{format_hours(rel['job_mtbf_hours'])}"))
    if s.skipped_steps:
        rows.append(("loss scaling", f"{s.skipped_steps} step(s) skipped on overflow"))
    return "\n".join(f"{k:<22} {v}" for k, v in rows)


# Estimated events (sim.budget) from which `run` starts a chart worker before simulating: the 16-GPU 1.3B
# README scenario (~3e5) takes a second or more; the seed scenarios (~10³) draw faster than a fork pays.
CHART_WORKER_EVENTS = 50_000


def _default_out(name: str) -> Path:
    return Path("results") / name


def cmd_run(args: argparse.Namespace) -> int:
    from sim.api import simulate, write_results
    from sim.budget import PROGRESS_EVENTS, check_budget
    from sim.outputs.report import write_report
    from sim.outputs.resultdir import ResultDir
    from sim.scenario.load import load_scenario

    if args.trace_gz and args.no_trace:
        raise ScenarioError("--trace-gz asks for trace.json.gz and --no-trace for no trace; give one of them",
                            "command line")
    sc = load_scenario(args.scenario, args.set or [])
    out = Path(args.out) if args.out else _default_out(sc.name)
    est = check_budget(sc, args.max_events)
    from sim.training.step_work import stack_notes

    for line in stack_notes(sc):
        print(f"dtsim: note: {line}", file=sys.stderr)
    # Charts of a run that takes a while: a worker imports matplotlib on another core while this one
    # simulates (sim.outputs.run_files.ChartWorker).
    worker = None
    if not args.no_charts and est.events >= CHART_WORKER_EVENTS:
        from sim.outputs.run_files import ChartWorker

        worker = ChartWorker.start()
    try:
        with ResultDir(out, "run") as staging:  # checks --out and locks it before any simulation
            try:
                result = simulate(sc, args.calibration, progress=est.events > PROGRESS_EVENTS)
            except BaseException:
                if worker is not None:  # stopped before the staging folder goes (write_results does likewise)
                    worker.close()
                raise
            write_results(result, staging, charts=not args.no_charts, trace=not args.no_trace,
                          trace_gz=args.trace_gz, worker=worker)
            if args.bubble_sweep and (sc.parallel is None or sc.parallel.pipeline == 1):
                print("dtsim: note: --bubble-sweep draws the bubble against micro-batches of a pipeline; this "
                      "scenario has none (parallel.pipeline 1), so there is no bubble_vs_m chart", file=sys.stderr)
            if args.bubble_sweep and sc.parallel is not None and sc.parallel.pipeline > 1:
                from sim.api import bubble_sweep
                from sim.outputs.bubble import plot_bubble_vs_microbatches

                p, v = sc.parallel.pipeline, sc.parallel.virtual_stages
                ms = sorted({p * k for k in (1, 2, 4, 8)} | {sc.microbatches} | ({1, 2} if v == 1 else set()))
                plot_bubble_vs_microbatches(bubble_sweep(sc, ms), p, staging / "bubble_vs_m", virtual_stages=v)
            write_report(staging, out)
    finally:
        if worker is not None:
            worker.close()
    cal = result.summary.calibration or {}
    if cal.get("extrapolated_ops"):
        print(f"dtsim: note: {cal['extrapolated_ops']} op(s) lie outside the shapes the profile measured and are "
              f"extrapolated (first: {cal.get('first_extrapolated_op')})", file=sys.stderr)
    if args.json:
        from sim.outputs.writers import summary_json

        sys.stdout.write(summary_json(result.summary))
    else:
        print(summary_table(result.summary))
        st = result.stats
        print(f"{'results':<22} {out}/ (simulated in {st['wall_s']:.2f} s: {st['transfers']} transfers, "
              f"{st['compute_events']} compute ops)")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from sim.scenario.load import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from sim.outputs import replot
    from sim.outputs.report import write_report
    from sim.outputs.resultdir import ResultDir, result_files
    from sim.paths import expand_path

    src = expand_path(args.result_dir, "result_dir")
    tl, summary = replot.load_result(src)  # a missing or corrupt result is refused before anything is written
    out = expand_path(args.out, "--out") if args.out else src.resolve()
    in_place = out.resolve() == src.resolve()
    # Into another folder: the source's files come along, so --out holds a whole result (one `dtsim plot`
    # can replot), not charts beside nothing; the charts drawn below replace the copied ones. Into its own
    # folder: the user's files there are never replaced (refused before drawing), NAME.prev never touched.
    seed = [] if in_place else result_files(src, fallback=replot.DATA_FILES)
    with ResultDir(out, "plot", field="--out" if args.out else "result_dir", in_place=in_place, seed_files=seed,
                   outputs=replot.plot_outputs(summary) if in_place else ()) as staging:
        names = [p.name for p in replot.draw_loaded(tl, summary, staging, src)]
        if in_place or (staging / "summary.json").exists():
            write_report(staging, out)
    for name in names:
        print(out / name)
    return 0


def cmd_calibrate(argv: list[str]) -> int:
    try:
        from calibrate.cli import main as calibrate_main
    except ImportError as e:  # torch missing
        raise ScenarioError(f"calibration needs torch ({e}); install it with `pip install -e .[calibrate]`",
                            "calibrate") from None
    return calibrate_main(argv)


def cmd_validate(argv: list[str]) -> int:
    if "--published" in argv:  # published runs vs simulation: sim only, no torch, no calibrate import
        from sim.validation.published import main as published_main

        return published_main(argv)
    try:
        from calibrate.validate import main as validate_main
    except ImportError as e:
        raise ScenarioError(f"validation needs torch ({e}); install it with `pip install -e .[calibrate]`",
                            "validate") from None
    return validate_main(argv)


def build_parser() -> argparse.ArgumentParser:
    from sim.budget import DEFAULT_MAX_EVENTS, positive_events
    from sim.explore.cli import path_text

    p = _Parser(prog="dtsim", description="Simulate distributed training on GPU clusters.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="simulate a scenario YAML and write results/<name>/")
    r.add_argument("scenario", help="scenario YAML file")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key, e.g. parallel.data=4")
    r.add_argument("--out", type=path_text, help="result folder (default results/<name>)")
    r.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    r.add_argument("--calibration", type=path_text, help="calibration profile JSON (overrides the scenario's)")
    r.add_argument("--no-charts", action="store_true", help="skip the PNG/SVG charts")
    r.add_argument("--max-events", type=positive_events, default=None,
                   help=f"refuse scenarios estimated above this many simulation events (default {DEFAULT_MAX_EVENTS:.0e})")
    r.add_argument("--no-trace", action="store_true", help="skip trace.json (timeline.csv keeps every span)")
    r.add_argument("--trace-gz", action="store_true",
                   help="write trace.json.gz instead of trace.json (~7x smaller; Perfetto opens it as is)")
    r.add_argument("--bubble-sweep", action="store_true",
                   help="also simulate m = p, 2p, 4p, 8p micro-batches and chart the bubble against m")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("schema", help="print the scenario JSON Schema")
    s.set_defaults(func=cmd_schema)

    pl = sub.add_parser("plot", help="redraw the charts of a result folder")
    pl.add_argument("result_dir")
    pl.add_argument("--out", type=path_text, help="folder for the charts (default: the result folder)")
    pl.set_defaults(func=cmd_plot)

    from sim.explore.cli import add_explore_commands

    add_explore_commands(sub)
    sub.add_parser("calibrate", help="benchmark this machine's kernels and collectives (needs torch)", add_help=False)
    sub.add_parser("validate", help="run a small real training job and compare with the simulation "
                   "(--published: compare with published training runs)", add_help=False)
    return p


def _warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """A Python warning as one plain line (no source path and line): users see what, not where."""
    text = str(message).splitlines()[0] if str(message) else category.__name__
    print(f"dtsim: warning: {text}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    import warnings

    with warnings.catch_warnings():
        warnings.showwarning = _warning_line
        return _main(argv)


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from sim.outputs import resultdir

    resultdir.interrupt_reported = False  # a command run before in this process (tests, scripts)
    try:
        if argv and argv[0] == "calibrate":
            code = cmd_calibrate(argv[1:])
        elif argv and argv[0] == "validate":
            code = cmd_validate(argv[1:])
        else:
            args = build_parser().parse_args(argv)
            code = args.func(args)
        if sys.stdout is not None:  # None when started with stdout closed (`dtsim run … >&-`)
            sys.stdout.flush()  # a closed pipe or a full disk shows here, inside the handlers below
        return code
    except ScenarioError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"dtsim: error: {msg}", file=sys.stderr)
        return 2
    except SimulationError as e:
        print(f"dtsim: simulation failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        if not resultdir.interrupt_reported:  # else its line already said so
            print("dtsim: interrupted", file=sys.stderr)
        from sim.processes import interrupt_status

        return interrupt_status(exc)
    except BrokenPipeError:  # `dtsim plan … | head -1`: the reader has what it wanted
        _silence_stdout()
        return 0
    except OSError as e:  # a full disk, a read-only file system, a folder removed under us
        _silence_stdout()
        what = f"writing {e.filename}" if e.filename else "writing the output"
        print(f"dtsim: error: {what} failed: {e.strerror or e}; {_os_error_fix(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        print("dtsim: error: out of memory; make the scenario smaller (fewer GPUs, micro-batches, steps)",
              file=sys.stderr)
        return 2
    except Exception as e:  # a bug in dtsim: one line for the user, the traceback on request
        if isinstance(e, RuntimeError) and "home directory" in str(e):  # expanduser of '~NOSUCHUSER/…'
            print("dtsim: error: a path starts with '~USER' for a user this machine does not have; write the "
                  "path out in full", file=sys.stderr)
            return 2
        if os.environ.get("DTSIM_TRACEBACK"):
            raise
        msg = str(e).splitlines()[0][:200] if str(e) else ""
        print(f"dtsim: internal error: {type(e).__name__}: {msg} — a bug in dtsim, please report it with the "
              "command; DTSIM_TRACEBACK=1 shows where", file=sys.stderr)
        return 1


def _os_error_fix(e: OSError) -> str:
    """The fix that matches an OS error met while writing outputs."""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return "free space or choose another destination"
    if e.errno == errno.ENAMETOOLONG:
        return "choose a shorter --out path"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "choose a folder you can write to (--out)"
    return "check the destination or choose another (--out)"


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    raise SystemExit(main())
