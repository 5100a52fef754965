"""`dtsim calibrate --out` as a new folder, the --resume note before any measurement, and profiles whose
collective fits name an op the simulator does not know."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from calibrate.cli import main

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "calibrate" / "profiles" / "cpu-amd-epyc.json"
SEED = str(ROOT / "scenarios" / "seed-pipeline.yaml")


@pytest.fixture
def no_measuring(monkeypatch):
    """The measurement replaced by recording the options it was given (the lock is still taken)."""
    import calibrate.run

    seen: list = []
    monkeypatch.setattr(calibrate.run, "run_calibration", lambda opts, config, argv: seen.append(opts))
    return seen


# ---- 1. --out newdir/ ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sep", ["/", os.sep])
def test_out_with_a_trailing_slash_is_a_new_folder_made_for_the_profile(sep, tmp_path, capsys, no_measuring):
    """Path('new/') drops the slash: 'new/' (a folder to be made) used to be refused as 'must be a .json
    file or an existing folder'. The profile goes to new/<default name>.json and the folder is made
    before the lock beside the profile is taken."""
    pytest.importorskip("torch")
    folder = tmp_path / "new" / "deeper"
    assert main(["--device", "cpu", "--quick", "--out", str(folder) + sep]) == 0, capsys.readouterr().err
    (opts,) = no_measuring
    assert opts.out.parent == folder and opts.out.name.startswith("cpu-") and opts.out.suffix == ".json"
    assert folder.is_dir() and os.listdir(folder) == []  # the lock was released
    assert capsys.readouterr().out.strip() == f"profile: {opts.out}"


def test_out_without_a_slash_still_needs_json_or_an_existing_folder(tmp_path, capsys, no_measuring):
    assert main(["--device", "cpu", "--quick", "--out", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err and ".json" in err and "new/" in err, err
    assert no_measuring == [] and not (tmp_path / "new").exists()


def test_out_folder_slash_over_an_existing_file_is_one_line(tmp_path, capsys, no_measuring):
    """'p.json/' names a folder; a file p.json is there: refused before torch, not a mkdir traceback."""
    (tmp_path / "p.json").write_text("{}")
    assert main(["--device", "cpu", "--quick", "--out", str(tmp_path / "p.json") + "/"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err and "is a file" in err and "Traceback" not in err, err
    assert no_measuring == [] and (tmp_path / "p.json").read_text() == "{}"


def test_report_out_with_a_trailing_slash_is_a_new_folder_for_the_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "plots"
    assert main(["--report", str(PROFILE), "--out", f"{folder}/"]) == 0, capsys.readouterr().err
    assert (folder / "cpu-amd-epyc.png").is_file()


def test_published_validate_out_with_a_trailing_slash_is_one_line(tmp_path, capsys):
    """`dtsim validate --published --out` is the JSON table's file: 't.json/' must not quietly write a
    file t.json (nor a folder's slash be dropped from the message)."""
    from sim.cli import main as dtsim

    assert dtsim(["validate", "--published", "--list", "--out", f"{tmp_path}/t.json/"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err and "t.json/" in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


# ---- 2. --resume of a missing profile: the note comes first --------------------------------------------


def test_resume_of_a_missing_profile_notes_it_before_measuring_once(tmp_path, capsys, monkeypatch):
    """The note 'does not exist yet, starting a new profile' came after the CPU probe (seconds of
    measuring); it is printed once, before the probe and any section."""
    pytest.importorskip("torch")
    import calibrate.probe
    from sim.errors import ScenarioError

    before_probe: list[str] = []

    def probe(config, threads):
        before_probe.append(capsys.readouterr().err)
        raise ScenarioError("stopped by the test at the probe", field="test")

    monkeypatch.setattr(calibrate.probe, "size_cpu_sweep", probe)
    out = tmp_path / "missing.json"
    assert main(["--device", "cpu", "--quick", "--resume", "--out", str(out)]) == 2
    note = f"--resume: {out} does not exist yet, starting a new profile"
    assert len(before_probe) == 1 and before_probe[0].count(note) == 1, before_probe
    assert note not in capsys.readouterr().err
    assert not out.exists()


def test_resume_note_is_printed_once_over_a_whole_run(tmp_path, capsys, monkeypatch):
    """Through run_calibration as well (the profile is started there): still one note."""
    pytest.importorskip("torch")
    import calibrate.metadata
    import calibrate.run

    monkeypatch.setattr(calibrate.metadata, "collect_metadata", lambda device, world, argv: {})
    monkeypatch.setattr(calibrate.run, "_measure", lambda name, opts, config, fault: None)
    out = tmp_path / "missing.json"
    assert main(["--device", "cpu", "--only", "collectives", "--resume", "--out", str(out)]) == 0
    assert capsys.readouterr().err.count(f"--resume: {out} does not exist yet") == 1


# ---- 3. an unknown collective op in a profile -----------------------------------------------------------


def _profile_with_op(tmp_path: Path, index: int, op: str) -> Path:
    data = json.loads(PROFILE.read_text())
    data["fits"]["collectives"][index]["op"] = op
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize("op", ["allreduce", "all-gather", "all_to_all", ""])
def test_a_collective_fit_of_an_unknown_op_is_refused_in_one_line(op, tmp_path, capsys):
    """A fit whose op the simulator does not know never matched, so the profile's link figures were
    silently not used; it is refused naming the field, the value, the allowed ops and a fix."""
    from sim.cli import main as dtsim

    p = _profile_with_op(tmp_path, 3, op)
    assert dtsim(["run", SEED, "--calibration", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(p) in err and f"fits.collectives[3].op = {op!r}" in err, err
    assert "all_reduce, reduce, broadcast, all_gather, reduce_scatter, send_recv" in err, err
    assert not (tmp_path / "o").exists()


def test_an_unknown_op_is_refused_by_calibrate_report_too(tmp_path, capsys):
    """`dtsim calibrate --report` read the fit and crashed in its closed form (ValueError traceback)."""
    p = _profile_with_op(tmp_path, 0, "allreduce")
    assert main(["--report", str(p), "--out", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fits.collectives[0].op = 'allreduce'" in err, err
    assert "did you mean 'all_reduce'" in err, err


def test_the_allowed_ops_are_those_calibrate_measures_and_the_simulator_prices_from():
    from calibrate.config import COLLECTIVE_OPS
    from calibrate.fit import CLOSED_FORM_TEXT
    from sim.cost.calibrated import LINK_SOURCE_OPS
    from sim.cost.profile import COLLECTIVE_FIT_OPS

    assert COLLECTIVE_FIT_OPS == COLLECTIVE_OPS  # a profile holds a fit of each op calibrate measures
    assert set(LINK_SOURCE_OPS) <= set(COLLECTIVE_FIT_OPS) and set(COLLECTIVE_FIT_OPS) <= set(CLOSED_FORM_TEXT)


def test_every_shipped_profile_still_loads():
    from sim.cost.profile import load_profile

    shipped = [p for p in ROOT.glob("**/*.json")
               if ".venv" not in p.parts and "results" not in p.parts and ".git" not in p.parts
               and '"dtsim-calibration-profile"' in p.read_text(errors="replace")[:4096]]
    assert shipped
    for p in shipped:
        load_profile(p)


# ---- --out over an existing file: the advice given, applied, is accepted -------------------------------


def _advised_out(err: str) -> str:
    """The --out the one-line error proposes."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--out" in lines[0] and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("slash", ["/", ""])
def test_out_over_an_existing_non_json_file_advises_a_json_name_that_works(slash, tmp_path, capsys,
                                                                           no_measuring):
    """'afile/' (a file afile is there) used to say 'drop the /', and 'afile' then said 'or --out afile/':
    neither works. Both now say it is an existing file and give a .json name, which is accepted."""
    pytest.importorskip("torch")
    (tmp_path / "afile").write_text("notes")
    assert main(["--device", "cpu", "--quick", "--out", f"{tmp_path / 'afile'}{slash}"]) == 2
    line = _advised_out(capsys.readouterr().err)
    assert "existing file" in line and "drop" not in line and "afile/" not in line.split("e.g.")[-1], line
    advised = line.split("e.g. --out ", 1)[1].split(")", 1)[0]
    assert advised.endswith(".json"), line
    assert main(["--device", "cpu", "--quick", "--out", advised]) == 0, capsys.readouterr().err
    (opts,) = no_measuring
    assert str(opts.out) == advised and (tmp_path / "afile").read_text() == "notes"


def test_out_json_file_with_a_slash_advice_to_drop_it_works(tmp_path, capsys, no_measuring):
    """'p.json/' over a file p.json: dropping the '/' (the advice) writes the profile to that file."""
    pytest.importorskip("torch")
    target = tmp_path / "p.json"
    target.write_text(PROFILE.read_text())  # an earlier profile (another .json is refused without --force)
    assert main(["--device", "cpu", "--quick", "--out", f"{target}/"]) == 2
    line = _advised_out(capsys.readouterr().err)
    assert "drop the '/'" in line, line
    assert main(["--device", "cpu", "--quick", "--out", str(target)]) == 0, capsys.readouterr().err
    (opts,) = no_measuring
    assert opts.out == target
