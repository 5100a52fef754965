"""Result folders are replaced whole: no mix of two runs, nothing of the user's lost, no hang on a lock,
and --out checked before any work."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sim.api
from sim.cli import main
from sim.outputs.resultdir import MANIFEST, ResultDir

ROOT = Path(__file__).resolve().parent.parent
SEED = str(ROOT / "scenarios" / "seed-pipeline.yaml")


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _leftovers(folder: Path) -> list[Path]:
    """Staging folders of ours (mkdtemp's names) left beside the result."""
    return [p for p in folder.glob(".r.tmp-*") if len(p.name) == len(".r.tmp-") + 8]


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")}


def _consistent(folder: Path) -> dict:
    """The folder is one complete result: its manifest lists exactly its dtsim files, at their sizes,
    and summary.json and resolved.yaml come from the same run. Returns the summary."""
    manifest = json.loads((folder / MANIFEST).read_text())
    ours = _files(folder) - {"notes.txt"}  # the user's file of some tests
    assert set(manifest["files"]) == ours, (manifest["files"], ours)
    for name, size in manifest["files"].items():
        assert (folder / name).stat().st_size == size, name
    summary = json.loads((folder / "summary.json").read_text())
    assert f"global_batch: {summary['global_batch']}" in (folder / "resolved.yaml").read_text()
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    return summary


def test_rerun_without_charts_drops_old_charts_and_keeps_prev(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out)]) == 0
    assert (out / "pipeline.png").exists()
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--set", "training.global_batch=16"]) == 0
    capsys.readouterr()
    assert not list(out.glob("*.png")) and "data:image/png" not in (out / "report.html").read_text()
    assert _consistent(out)["global_batch"] == 16
    prev = tmp_path / "r.prev"
    assert (prev / "pipeline.png").exists() and _consistent(prev)["global_batch"] == 8
    assert not _leftovers(tmp_path)


def test_user_files_survive_and_foreign_folders_are_refused(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and "notes.txt" not in json.loads(
        (out / MANIFEST).read_text())["files"]
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    capsys.readouterr()
    assert main(["run", SEED, "--out", str(home), "--no-charts"]) == 2
    assert "not a dtsim result" in _one_line(capsys.readouterr().err)
    assert os.listdir(home) == ["thesis.tex"]


def test_a_folder_without_manifest_is_never_taken_for_a_result(tmp_path, capsys) -> None:
    """A folder of the user's own pictures, or one whose files merely carry dtsim's output names (their own
    best.yaml, timeline.csv: they used to be taken for outputs, moved to NAME.prev and deleted by the next
    run), has no manifest: refused with one line, every file untouched."""
    for name, files in (("pics", {"mine.png": "art"}),
                        ("exp", {"best.yaml": "my tuned layout", "timeline.csv": "my data", "notes.txt": "x"})):
        folder = tmp_path / name
        folder.mkdir()
        for f, text in files.items():
            (folder / f).write_text(text)
        for _ in range(2):
            assert main(["run", SEED, "--out", str(folder), "--no-charts"]) == 2
            assert "not a dtsim result" in _one_line(capsys.readouterr().err)
        assert {f: (folder / f).read_text() for f in os.listdir(folder)} == files
        assert not (tmp_path / f"{name}.prev").exists()


def test_a_user_file_named_as_an_output_stays_in_prev_and_is_never_deleted(tmp_path, capsys) -> None:
    """The user's gantt.png in a result made without charts: the rerun with charts writes its own gantt.png,
    so the user's stays in r.prev, named on stderr; the next run refuses to replace r.prev until it is
    moved, and nothing of the user's is lost on the way."""
    out, prev = tmp_path / "r", tmp_path / "r.prev"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    (out / "gantt.png").write_text("my own chart")
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["run", SEED, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "gantt.png" in err and "r.prev" in err
    assert (prev / "gantt.png").read_text() == "my own chart"
    assert (out / "notes.txt").read_text() == "mine" and (out / "gantt.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 2
    assert "gantt.png" in _one_line(capsys.readouterr().err)
    assert (prev / "gantt.png").read_text() == "my own chart" and (out / "notes.txt").read_text() == "mine"


def test_a_swap_that_fails_undoes_every_step(tmp_path, capsys, monkeypatch) -> None:
    """The last rename of the swap fails (as on a mount point): the earlier result is back at r, the one
    before at r.prev, the user's file where it was, no staging folder left, one line, exit status 2; the
    next run works and still carries the user's file."""
    import sim.outputs.resultdir as rd

    out, prev = tmp_path / "r", tmp_path / "r.prev"
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--set", "training.global_batch=16"]) == 0
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    (out / "notes.txt").write_text("mine")
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    before_prev = {f: (prev / f).read_bytes() for f in os.listdir(prev)}
    real_rename = os.rename

    def busy(src, dst):
        if Path(src).name.startswith(".r.tmp-") and Path(dst) == out:
            raise OSError(16, "Device or resource busy")
        real_rename(src, dst)

    monkeypatch.setattr(rd.os, "rename", busy)
    capsys.readouterr()
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--set", "training.global_batch=32"]) == 2
    assert "unchanged" in _one_line(capsys.readouterr().err)
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    assert {f: (prev / f).read_bytes() for f in os.listdir(prev)} == before_prev
    assert not _leftovers(tmp_path)
    monkeypatch.setattr(rd.os, "rename", real_rename)
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--set", "training.global_batch=32"]) == 0
    assert _consistent(out)["global_batch"] == 32 and (out / "notes.txt").read_text() == "mine"


def test_plot_in_place_keeps_the_previous_run(tmp_path, capsys) -> None:
    """`dtsim plot r` redraws r's charts file by file: r.prev (an earlier, different run) is untouched, r is
    still one consistent result and the user's file in it stays."""
    out, prev = tmp_path / "r", tmp_path / "r.prev"
    assert main(["run", SEED, "--out", str(out), "--set", "training.global_batch=16"]) == 0
    assert main(["run", SEED, "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    before_prev = {f: (prev / f).read_bytes() for f in os.listdir(prev)}
    summary = (out / "summary.json").read_bytes()
    assert main(["plot", str(out)]) == 0
    capsys.readouterr()
    assert {f: (prev / f).read_bytes() for f in os.listdir(prev)} == before_prev
    assert _consistent(prev)["global_batch"] == 16 and _consistent(out)["global_batch"] == 8
    assert (out / "summary.json").read_bytes() == summary and (out / "notes.txt").read_text() == "mine"
    assert not _leftovers(tmp_path)


def test_plot_into_an_earlier_result_makes_a_complete_replot(tmp_path, capsys) -> None:
    """`dtsim plot a --out b` over an earlier result b: b becomes a's result (its data files byte for byte,
    charts redrawn, a report) that `dtsim plot b` replots in turn; the old b is b.prev with the user's file
    moved across as on every rerun; a's own files and a's user file stay in a."""
    a, b, b_prev = tmp_path / "a", tmp_path / "r", tmp_path / "r.prev"
    assert main(["run", SEED, "--out", str(a), "--trace-gz"]) == 0
    assert main(["run", SEED, "--out", str(b), "--set", "training.global_batch=16"]) == 0
    (b / "notes.txt").write_text("mine")
    (a / "mine-in-a.txt").write_text("a's")
    before_a = {f: (a / f).read_bytes() for f in os.listdir(a)}
    old_b = (b / "summary.json").read_bytes()
    assert main(["plot", str(a), "--out", str(b)]) == 0
    capsys.readouterr()
    for name in ("summary.json", "timeline.csv", "timeline_meta.json", "trace.json.gz", "resolved.yaml"):
        assert (b / name).read_bytes() == (a / name).read_bytes(), name
    assert (b / "gantt.png").read_bytes() == (a / "gantt.png").read_bytes() and (b / "report.html").exists()
    assert _consistent(b)["global_batch"] == 8 and (b / "notes.txt").read_text() == "mine"
    assert not (b / "mine-in-a.txt").exists()
    assert (b_prev / "summary.json").read_bytes() == old_b and _consistent(b_prev)["global_batch"] == 16
    assert {f: (a / f).read_bytes() for f in os.listdir(a)} == before_a
    assert main(["plot", str(b)]) == 0  # b is a result folder of its own
    assert main(["plot", str(b), "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "summary.json").read_bytes() == (a / "summary.json").read_bytes()
    (a / MANIFEST).unlink()  # a folder from before manifests: its data files by name, never the user's file
    assert main(["plot", str(a), "--out", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / "trace.json.gz").read_bytes() == (a / "trace.json.gz").read_bytes()
    assert _consistent(tmp_path / "d")["global_batch"] == 8 and not (tmp_path / "d" / "mine-in-a.txt").exists()
    assert not _leftovers(tmp_path)


def test_only_our_own_leftovers_are_removed(tmp_path, capsys) -> None:
    """A killed run's staging folder (.r.tmp- and mkdtemp's eight characters) goes with the next run; the
    user's .r.tmp-backup folder and a .draft.tmp file inside the result do not."""
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    (tmp_path / ".r.tmp-abcd1234").mkdir()
    (tmp_path / ".r.tmp-backup").mkdir()
    (tmp_path / ".r.tmp-backup" / "old.txt").write_text("keep")
    (out / ".draft.tmp").write_text("mine")
    for _ in range(2):
        assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    capsys.readouterr()
    assert not (tmp_path / ".r.tmp-abcd1234").exists()
    assert (tmp_path / ".r.tmp-backup" / "old.txt").read_text() == "keep"
    assert (out / ".draft.tmp").read_text() == "mine"


@pytest.mark.parametrize("bad", ["file", "/dev/null", "under-file", "/proc/dtsim-x"])
def test_bad_out_refused_before_any_simulation(bad, tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "file").write_text("x")
    out = {"file": tmp_path / "file", "under-file": tmp_path / "file" / "sub"}.get(bad, Path(bad))

    def no_simulation(*a, **k):
        raise AssertionError("simulated before checking --out")

    monkeypatch.setattr(sim.api, "simulate", no_simulation)
    for argv in (["run", SEED], ["compare", SEED, SEED], ["sweep", SEED, "--grid", "parallel.pipeline=2,4"],
                 ["plan", str(ROOT / "scenarios" / "gpt3-1.3b-16xa100.yaml")]):
        assert main([*argv, "--out", str(out)]) == 2, argv
        assert "--out" in _one_line(capsys.readouterr().err)
    assert (tmp_path / "file").read_text() == "x"


def test_second_writer_fails_fast_with_one_line(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    holder = ResultDir(out, "test")
    with holder:
        t0 = time.perf_counter()
        assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 2
        assert time.perf_counter() - t0 < 5
        assert "another dtsim is writing" in _one_line(capsys.readouterr().err)
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0  # the lock went with the first


def test_interrupt_while_writing_leaves_the_old_result(tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    before = {n: (out / n).read_bytes() for n in _files(out)}
    import sim.outputs.report as report

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_report", interrupted)
    capsys.readouterr()
    assert main(["run", SEED, "--out", str(out), "--set", "training.global_batch=16"]) == 130
    err = capsys.readouterr().err
    assert "removed the unfinished result" in err and "unchanged" in err
    assert {n: (out / n).read_bytes() for n in _files(out)} == before
    assert not _leftovers(tmp_path) and not (tmp_path / "r.prev").exists()


def test_compare_folder_is_not_named_compare_compare(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    a = ROOT / "scenarios" / "compare-llama3-8b-8xh100-ndr.yaml"
    b = ROOT / "scenarios" / "compare-llama3-8b-16xa100-hdr.yaml"
    assert main(["compare", str(a), str(b), "--no-charts", "--no-progress", "--workers", "1",
                 "--set", "training.global_batch=16"]) == 0
    (folder,) = (tmp_path / "results").iterdir()
    assert folder.name.startswith("compare-llama3") and "compare-compare" not in folder.name


def test_kill_at_random_points_never_leaves_a_mixed_folder(tmp_path) -> None:
    """SIGINT/SIGTERM at random moments of `dtsim run` over an earlier result: the folder is always the
    old result or the new one, complete, and no temporary files are left behind."""
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "sim", "run", SEED, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    t0 = time.perf_counter()
    subprocess.run([*cmd, "--set", "training.global_batch=16"], check=True, capture_output=True, env=env, cwd=ROOT)
    full_s = time.perf_counter() - t0
    rng = random.Random(13)
    seen = set()
    for trial in range(4):
        sig = (signal.SIGINT, signal.SIGTERM)[trial % 2]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        time.sleep(rng.uniform(0.4, max(0.5, full_s * 1.1)))
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        assert p.returncode in (0, 128 + sig, -sig), (p.returncode, err)  # 130 for SIGINT, 143 for SIGTERM
        assert "Traceback" not in err, err
        assert sum("interrupted" in line for line in err.splitlines()) <= 1, err  # one line says it
        summary = _consistent(out)
        seen.add(summary["global_batch"])
        assert summary["global_batch"] in (16, 8)  # the old result or the new one (the scenario's own)
        assert not _leftovers(tmp_path), list(tmp_path.iterdir())
        if (tmp_path / "r.prev").exists():
            _consistent(tmp_path / "r.prev")


def test_interrupt_while_writing_the_manifest_leaves_the_old_result(tmp_path, capsys, monkeypatch) -> None:
    """Ctrl-C inside commit() before the swap (the manifest is written with signals still open): the staging
    folder is removed and the previous result stays as it was."""
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    before = {n: (out / n).read_bytes() for n in _files(out)}

    def interrupted(self, staging):
        raise KeyboardInterrupt

    monkeypatch.setattr(ResultDir, "_write_manifest", interrupted)
    capsys.readouterr()
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--set", "training.global_batch=16"]) == 130
    assert "removed the unfinished result" in capsys.readouterr().err
    assert {n: (out / n).read_bytes() for n in _files(out)} == before
    assert not _leftovers(tmp_path) and not (tmp_path / "r.prev").exists()


def test_ctrl_c_turned_into_another_error_by_a_library_is_still_an_interrupt(tmp_path, capsys, monkeypatch) -> None:
    """A SIGINT whose KeyboardInterrupt a library converts (matplotlib can raise ValueError from inside a
    draw) exits 130 as an interruption, removes the unfinished result and keeps the old one."""
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    before = {n: (out / n).read_bytes() for n in _files(out)}
    import sim.outputs.report as report

    def swallowed(*a, **k):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass
        raise ValueError("Invalid bounding box")

    monkeypatch.setattr(report, "write_report", swallowed)
    capsys.readouterr()
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--set", "training.global_batch=16"]) == 130
    err = capsys.readouterr().err
    assert "internal error" not in err and "removed the unfinished result" in err
    assert {n: (out / n).read_bytes() for n in _files(out)} == before
    assert not _leftovers(tmp_path)


def test_an_interrupt_dropped_by_a_finaliser_still_stops_and_prints_no_traceback(tmp_path, capfd) -> None:
    """A SIGTERM whose KeyboardInterrupt fires inside __del__ (Python only reports it there) still aborts
    the result, the report shows no traceback, and the interrupt raised again still says SIGTERM, so the
    command exits 143 as a SIGTERM should (it exited 130, as for Ctrl-C)."""
    from sim.processes import interrupt_status


    class KillsOnCollect:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes, here: inside the finaliser
                pass

    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt) as caught, ResultDir(out, "test") as staging:
        (staging / "a.txt").write_text("new")
        obj = KillsOnCollect()
        del obj  # the interrupt is raised and dropped inside __del__; the body carries on
        (staging / "b.txt").write_text("new")
    assert "Traceback" not in capfd.readouterr().err
    assert interrupt_status(caught.value) == 143
    assert not out.exists() and not list(tmp_path.glob(".r.tmp-*"))


def _signal_inside(monkeypatch, target, name: str, sig: int) -> None:
    """Make ``target.name`` send ``sig`` to this process when it returns (a real signal, handled by the
    ResultDir handler at the next bytecode)."""
    real = getattr(target, name)

    def wrapped(*args, **kwargs):
        value = real(*args, **kwargs)
        os.kill(os.getpid(), sig)
        return value

    monkeypatch.setattr(target, name, wrapped)


def test_a_signal_while_the_staging_folder_is_made_leaves_nothing_behind(tmp_path, capsys, monkeypatch) -> None:
    """SIGTERM right after mkdtemp made the staging folder and before its name is kept: the folder is still
    removed, the old result stays, the exit status says SIGTERM (143)."""
    import sim.outputs.resultdir as rd

    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    before = {n: (out / n).read_bytes() for n in _files(out)}
    _signal_inside(monkeypatch, rd.tempfile, "mkdtemp", signal.SIGTERM)
    capsys.readouterr()
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--set", "training.global_batch=16"]) == 143
    assert {n: (out / n).read_bytes() for n in _files(out)} == before
    assert not _leftovers(tmp_path), list(tmp_path.iterdir())


def test_a_signal_as_the_manifest_is_written_keeps_the_old_result(tmp_path, capsys, monkeypatch) -> None:
    """SIGINT arriving as the manifest is finished (before the swap): the swap does not start, the staging
    folder goes, the old result stays."""
    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    before = {n: (out / n).read_bytes() for n in _files(out)}
    _signal_inside(monkeypatch, ResultDir, "_write_manifest", signal.SIGINT)
    capsys.readouterr()
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--set", "training.global_batch=16"]) == 130
    assert "removed the unfinished result" in capsys.readouterr().err
    assert {n: (out / n).read_bytes() for n in _files(out)} == before
    assert not _leftovers(tmp_path)


def test_a_signal_during_the_swap_lets_it_finish_then_stops(tmp_path, capsys, monkeypatch) -> None:
    """SIGTERM in the middle of the swap (between the renames) waits for it: the new result is whole in
    place, the previous one is r.prev, nothing is left half-moved, and the run still ends as SIGTERM."""
    import sim.outputs.resultdir as rd

    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    _signal_inside(monkeypatch, rd, "_fsync_dir", signal.SIGTERM)
    capsys.readouterr()
    assert main(["run", SEED, "--out", str(out), "--no-charts", "--set", "training.global_batch=16"]) == 143
    assert _consistent(out)["global_batch"] == 16
    assert _consistent(tmp_path / "r.prev")["global_batch"] == 8
    assert not _leftovers(tmp_path)


def _shown_fix(line: str, new: Path) -> list[str]:
    """The `dtsim plot … --out NEW` command an error line advises, with NEW filled in, as main's argv."""
    import shlex

    start = line.rindex("dtsim plot ")
    cmd = shlex.split(line[start:].split(" --out NEW")[0] + " --out NEW")
    assert cmd[:2] == ["dtsim", "plot"] and cmd[-1] == "NEW", line
    return cmd[1:-1] + [str(new)]


def test_plot_in_place_never_replaces_a_users_file(tmp_path, capsys, monkeypatch) -> None:
    """The user's gantt.png in a result made without charts (not in the manifest): `dtsim plot r` refuses in
    one line before drawing, naming the file and the fix, and the file stays byte for byte; the advised
    `--out NEW` works. A user's file that appears while the charts are drawn is refused at the commit."""
    import sim.outputs.replot as replot

    out = tmp_path / "r"
    assert main(["run", SEED, "--out", str(out), "--no-charts"]) == 0
    (out / "gantt.png").write_text("MY OWN GANTT")
    manifest = (out / MANIFEST).read_bytes()
    drawn: list[Path] = []
    real_draw = replot.draw_loaded
    monkeypatch.setattr(replot, "draw_loaded", lambda *a: drawn.append(a[2]) or real_draw(*a))
    capsys.readouterr()
    assert main(["plot", str(out)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("dtsim: error: result_dir: ") and "gantt.png" in line, line
    assert not drawn and (out / "gantt.png").read_text() == "MY OWN GANTT"
    assert (out / MANIFEST).read_bytes() == manifest and not _leftovers(tmp_path)
    assert main(["plot", str(out), "--out", str(out)]) == 2  # the same folder named by --out
    assert _one_line(capsys.readouterr().err).startswith("dtsim: error: --out: ")
    assert main(_shown_fix(line, tmp_path / "new")) == 0
    assert (tmp_path / "new" / "gantt.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "gantt.png").read_text() == "MY OWN GANTT"
    (out / "gantt.png").unlink()

    def draw_then_user_writes(tl, summary, staging, src):
        paths = real_draw(tl, summary, staging, src)
        (out / "pipeline.svg").write_text("drawn by hand meanwhile")
        return paths

    monkeypatch.setattr(replot, "draw_loaded", draw_then_user_writes)
    capsys.readouterr()
    assert main(["plot", str(out)]) == 2
    assert "pipeline.svg" in _one_line(capsys.readouterr().err)
    assert (out / "pipeline.svg").read_text() == "drawn by hand meanwhile"
    assert (out / MANIFEST).read_bytes() == manifest and not (out / "gantt.png").exists()
    assert not _leftovers(tmp_path)


def test_plot_in_place_of_a_folder_without_manifest_advises_a_fix_that_works(tmp_path, capsys) -> None:
    """A result from before manifests: `dtsim plot leg` (no --out) refuses in one line that names result_dir,
    not --out, and does not advise moving the result away; the `dtsim plot … --out NEW` it advises works and
    copies only the data files (not the user's)."""
    leg = tmp_path / "leg"
    assert main(["run", SEED, "--out", str(leg)]) == 0
    (leg / MANIFEST).unlink()
    (leg / "notes.txt").write_text("mine")
    before = {f: (leg / f).read_bytes() for f in os.listdir(leg)}
    capsys.readouterr()
    assert main(["plot", str(leg)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("dtsim: error: result_dir: ") and "move those files away" not in line, line
    assert {f: (leg / f).read_bytes() for f in os.listdir(leg)} == before
    new = tmp_path / "new"
    assert main(_shown_fix(line, new)) == 0
    assert _consistent(new)["global_batch"] == 8 and not (new / "notes.txt").exists()
    assert main(["plot", str(new)]) == 0
    assert {f: (leg / f).read_bytes() for f in os.listdir(leg)} == before


def test_plot_in_place_is_not_blocked_by_the_users_file_in_prev(tmp_path, capsys) -> None:
    """r.prev holds the user's bubble_vs_m.png (its name became an output of the rerun): `dtsim plot r` never
    touches r.prev, so it redraws r and leaves r.prev byte for byte."""
    out, prev = tmp_path / "r", tmp_path / "r.prev"
    assert main(["run", SEED, "--out", str(out)]) == 0
    (out / "bubble_vs_m.png").write_text("mine")
    assert main(["run", SEED, "--out", str(out), "--bubble-sweep"]) == 0
    assert (prev / "bubble_vs_m.png").read_text() == "mine"
    before_prev = {f: (prev / f).read_bytes() for f in os.listdir(prev)}
    capsys.readouterr()
    assert main(["plot", str(out)]) == 0
    assert {f: (prev / f).read_bytes() for f in os.listdir(prev)} == before_prev
    assert _consistent(out)["global_batch"] == 8 and (out / "bubble_vs_m.png").read_bytes()[:4] == b"\x89PNG"
    assert not _leftovers(tmp_path)
