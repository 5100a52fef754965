"""`dtsim calibrate`: measure this machine's kernels and collectives into a profile, or report on one.

Exit codes: 0 success; 1 the measurement failed (a worker died or hung; finished sections are kept);
2 bad arguments (one line on stderr naming the option, the value, the rule and a fix); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from calibrate.argtypes import (
    MAX_CPU_WORKERS,
    OutPath,
    Parser,
    comma_items,
    out_path_arg,
    parse,
    path_arg,
    positive_int,
)
from calibrate.config import SECTIONS, make_config
from calibrate.progress import note
from calibrate.run import CalibrationOptions, resume_starts_new
from sim.errors import ScenarioError
from sim.processes import interrupt_status

PROG = "dtsim calibrate"
DEFAULT_OUT_DIR = Path("results") / "calibration"


def _device(value: str) -> str:
    if value not in ("cuda", "cpu"):
        raise argparse.ArgumentTypeError(f"got {value!r}; must be 'cuda' or 'cpu' (e.g. --device cpu)")
    return value


def _sections(value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(comma_items(value, "--only", "gemm,memory")))
    if any(n not in SECTIONS for n in names):
        raise argparse.ArgumentTypeError(
            f"got {value!r}; must be a comma-separated subset of {','.join(SECTIONS)} (e.g. --only gemm,memory)"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Measure GEMMs, memory bandwidth and collectives; write a profile.")
    p.add_argument("--device", type=_device, default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument(
        "--gpus",
        type=positive_int("--gpus", 2),
        default=None,
        help="GPUs (cuda) or worker processes (cpu) for collectives; default: all GPUs / min(4, cores)",
    )
    p.add_argument(
        "--out",
        type=out_path_arg("--out", "results/cpu-profile.json"),
        default=None,
        help=f"profile path (.json) or folder (a new one ends in /); default "
        f"{DEFAULT_OUT_DIR}/<device>-<model>.json. With --report: where the PNG goes",
    )
    p.add_argument("--quick", action="store_true", help="a small sweep (about two minutes)")
    p.add_argument("--only", type=_sections, default=SECTIONS, help=f"sections to run: {','.join(SECTIONS)}")
    p.add_argument("--resume", action="store_true", help="keep finished sections of --out and run the rest")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing profile at --out even when this run measures fewer sections than it holds",
    )
    p.add_argument(
        "--report",
        type=path_arg("--report", "results/calibration/cpu-profile.json"),
        default=None,
        metavar="PROFILE",
        help="print fit quality of PROFILE and plot measured vs fitted curves (no measuring)",
    )
    return p


def slug(text: str) -> str:
    """A filename-safe short form of a device name: 'NVIDIA H100 80GB HBM3' → 'nvidia-h100-80gb-hbm3'."""
    s = re.sub(r"\(r\)|\(tm\)|processor|cpu @.*", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-")[:40] or "device"


def _torch() -> ModuleType:
    try:
        import torch
    except ImportError as exc:
        raise ScenarioError(
            f"torch is not importable ({exc}); the rule is that measuring needs torch: "
            "pip install 'dtsim[calibrate]' (or use --report, which does not)",
            field="--device",
        ) from exc
    return torch


def _resolve(args: argparse.Namespace) -> CalibrationOptions:
    """Validate against this machine and build the run's options."""
    from calibrate.launch import torchrun_env, usable_cores
    from calibrate.metadata import cpu_model

    target: OutPath | None = args.out
    folder = target is not None and (target.folder or target.path.is_dir())
    if target is not None:  # checked first: a wrong path should not wait for torch or the devices
        _check_out_target(target, folder, args)
    torch = _torch()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    launched = torchrun_env()
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ScenarioError(
                f"'cuda' requested but torch {torch.__version__} sees no CUDA GPU; "
                "use --device cpu, or run on a GPU machine with a CUDA build of torch",
                field="--device",
            )
        available = torch.cuda.device_count()
        world = args.gpus or available
        if not launched and world > available:
            raise ScenarioError(
                f"{world} requested but only {available} GPU(s) visible; must be <= {available} (e.g. --gpus {available})",
                field="--gpus",
            )
        name = torch.cuda.get_device_name(0)
    else:
        cores = usable_cores()
        world = args.gpus or max(2, min(4, cores))
        if world > MAX_CPU_WORKERS:
            raise ScenarioError(
                f"{world} worker processes requested; must be <= {MAX_CPU_WORKERS} on cpu (e.g. --gpus {min(4, cores)})",
                field="--gpus",
            )
        name = cpu_model()
    if launched:
        if args.gpus and args.gpus != launched[1]:
            raise ScenarioError(
                f"{args.gpus} given but torchrun started WORLD_SIZE={launched[1]}; must match (or drop --gpus)",
                field="--gpus",
            )
        world = launched[1]
    default_name = f"{device}-{slug(name)}" + (f"-x{world}" if device == "cuda" else "") + ".json"
    if target is None:
        out = DEFAULT_OUT_DIR / default_name
    else:
        out = target.path / default_name if folder else target.path
    _check_out(out, args)
    return CalibrationOptions(device=device, world=world, out=out, sections=args.only, resume=args.resume)


def _check_out_target(target: OutPath, folder: bool, args: argparse.Namespace) -> None:
    """--out as given, before torch: a .json file, an existing folder, or a folder to make ('new/')."""
    path = target.path
    is_file = (path.exists() or path.is_symlink()) and not path.is_dir()
    if is_file and path.suffix != ".json":  # neither 'afile' nor 'afile/' can be the profile: name others
        named = f"{str(target)!r} names a folder but " if target.folder else ""
        raise ScenarioError(
            f"{named}{str(path)!r} is an existing file, neither a .json profile nor a folder; give a .json file "
            f"name (e.g. --out {path.with_suffix('.json')}) or another folder",
            field="--out",
        )
    if target.folder and is_file:
        raise ScenarioError(
            f"{str(target)!r} names a folder (it ends in {os.sep!r}) but {str(path)!r} is a file; drop "
            f"the {os.sep!r} to write the profile to that file, or give another folder",
            field="--out",
        )
    if not folder and path.suffix != ".json":
        raise ScenarioError(
            f"{str(target)!r} must be a .json file or a folder, an existing one or a new one written with a "
            f"trailing {os.sep!r} (e.g. --out results/cpu-profile.json, or --out {path}{os.sep} for a new "
            "folder)",
            field="--out",
        )
    if not folder:
        _check_out(target.path, args)


def _check_out(out: Path, args: argparse.Namespace) -> None:
    """Before any measurement: --out is writable, and an existing profile is never silently cut down."""
    from sim.outputs.resultdir import check_output_file

    check_output_file(out, "--out", (".json",))
    if not out.exists() or args.resume:
        return
    # Re-measuring over a profile saves its sections to NAME.partial.json first (calibrate.run.progress_path):
    # one already there is an interrupted run's finished sections, or the user's own file; never overwrite it.
    partial = out.with_name(f"{out.stem}.partial{out.suffix}")
    if partial.exists() or partial.is_symlink():
        raise ScenarioError(
            f"{str(partial)!r} exists (the finished sections of an interrupted calibration, which this run would "
            f"save its sections over); finish it with --resume --out {partial}, or move it away",
            field="--out",
        )
    if args.force:
        return
    from calibrate.profile import finished_sections, load_profile

    try:
        have = finished_sections(load_profile(out, field="--out"))
    except ScenarioError as exc:  # not a profile this run could extend: say how to replace it, not to rerun
        text = str(exc).removeprefix("--out: ").split("; re-run", 1)[0].split("; give a profile", 1)[0]
        raise ScenarioError(f"{text}; add --force to replace it, or give another --out", field="--out") from None
    dropped = sorted(have - set(args.only))
    if dropped:
        raise ScenarioError(
            f"{str(out)!r} already holds the {', '.join(sorted(have))} section(s) and this run measures only "
            f"{','.join(args.only)}, which would drop {', '.join(dropped)}; add --resume to merge into it "
            "(keeping its sections), or --force to replace it",
            field="--out",
        )


def _make_parent(out: Path) -> None:
    """Create the folder of ``out`` (the default results/calibration, or a new one named by --out): the
    profile (or the --report plot) would be written there anyway, and a profile's lock beside it needs it now."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError(
            f"{str(out.parent)!r} cannot be made ({exc.strerror}); choose a folder you can write to",
            field="--out",
        ) from None


def _report(args: argparse.Namespace) -> int:
    from calibrate.profile import load_profile
    from calibrate.report import format_report, plot_profile

    profile = load_profile(args.report, field="--report")
    target: OutPath | None = args.out
    if target is None:
        png = args.report.with_suffix(".png")
    elif target.folder or target.path.is_dir():  # 'plots/': a folder, made if new
        png = target.path / (args.report.stem + ".png")
    elif target.path.suffix != ".png":
        raise ScenarioError(
            f"{str(target)!r} with --report must be a .png file or a folder, an existing one or a new one written "
            f"with a trailing {os.sep!r} (e.g. --out fits.png)",
            field="--out",
        )
    else:
        png = target.path
    from sim.outputs.resultdir import check_output_file

    check_output_file(png, "--out", (".png",))
    _make_parent(png)
    print(format_report(profile, str(args.report)))
    print(f"plot: {plot_profile(profile, png)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run `dtsim calibrate` with ``argv`` (the arguments after 'calibrate'); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(build_parser(), argv, PROG)
    if isinstance(args, int):
        return args

    from calibrate.launch import CalibrationError, torchrun_env

    out = progress = None
    lock: tuple[int | None, Path] | None = None
    previous = _sigterm_as_interrupt()
    try:
        if args.report is not None:
            return _report(args)
        opts = _resolve(args)
        if (torchrun_env() or (0, 1))[0] == 0:  # rank 0 writes the profile: two runs would mix their sections
            from sim.outputs.resultdir import take_lock

            _make_parent(opts.out)  # the lock file goes beside the profile: a new --out folder must exist first
            lock = take_lock(opts.out, "--out")
            if opts.resume and not opts.out.exists():  # said now, not after seconds of probing the CPU
                note(resume_starts_new(opts.out))
        out = opts.out
        from calibrate.run import progress_path, run_calibration

        progress = progress_path(opts)

        run_calibration(opts, make_config(opts.device, args.quick), argv)
        if (torchrun_env() or (0, 1))[0] == 0:
            print(f"profile: {out}")
        return 0
    except ScenarioError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except CalibrationError as exc:
        print(f"{PROG}: error: {exc}{_kept(out, progress)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        print(f"{PROG}: interrupted{_kept(out, progress)}", file=sys.stderr)
        return interrupt_status(exc)
    finally:
        if lock is not None:
            from sim.outputs.resultdir import release_lock

            release_lock(*lock)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _sigterm_as_interrupt() -> Any:
    """SIGTERM unwinds like Ctrl-C (workers stopped, the one-line message, exit 143); the old handler, or
    None where signals cannot be set (not the main thread)."""
    def to_interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    try:
        return signal.signal(signal.SIGTERM, to_interrupt)
    except ValueError:
        return None


def _kept(out: Path | None, progress: Path | None) -> str:
    """What an unfinished run left: its finished sections, and (re-measuring a profile) the old one whole."""
    if out is None or progress is None or not progress.exists():
        return ""
    if progress == out:
        return f"; finished sections are kept in {out} (rerun with --resume)"
    return (f"; {out} is unchanged, the finished sections are kept in {progress} (rerun with --resume "
            f"--out {progress} to finish them, then move it over {out})")


if __name__ == "__main__":
    sys.exit(main())
