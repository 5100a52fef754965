"""`dtsim validate --published --cases FILE`: a file that is not a case set is one line naming --cases and
exit status 2 (a binary file used to be an internal error, exit 1), before any case runs."""

from __future__ import annotations

import os

import pytest

from sim.cli import main
from sim.validation.published import DEFAULT_CASES, MAX_CASES_BYTES


def _refused(argv: list[str], needle: str, capsys) -> str:
    assert main(["validate", "--published", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "internal error" not in err, err
    assert "--cases" in err and needle in err, err
    return err


@pytest.mark.parametrize(
    "content,needle",
    [
        (bytes(range(256)) * 4, "not a text file (byte 128 is not UTF-8)"),
        ("name: café\n".encode("latin-1"), "not a text file (byte 9 is not UTF-8)"),
        (b"cases: [1,\n", "not valid YAML (line 2"),
        (b"- a\n- b\n", "has no top-level cases: list"),
        (b"", "is empty"),
        (b"cases: 5\n", "cases: 5 — must be a list"),
        (b"cases:\n  - 1\n  - x\n", "cases.0: 1 — must be a mapping"),
        (b"cases: []\n", "needs at least 1 item"),
    ],
)
def test_a_file_that_is_not_a_case_set_is_one_line(tmp_path, capsys, content: bytes, needle: str) -> None:
    bad = tmp_path / "cases.yaml"
    bad.write_bytes(content)
    _refused(["--cases", str(bad), "--list"], needle, capsys)


def test_a_path_that_is_not_a_file_is_one_line(tmp_path, capsys) -> None:
    _refused(["--cases", str(tmp_path / "none.yaml"), "--list"], "no such file", capsys)
    _refused(["--cases", str(tmp_path), "--list"], "is not a file", capsys)
    _refused(["--cases", "/dev/zero", "--list"], "is not a file", capsys)
    fifo = tmp_path / "fifo"
    if hasattr(os, "mkfifo"):
        os.mkfifo(fifo)
        _refused(["--cases", str(fifo), "--list"], "is not a file", capsys)  # refused, never a hang
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:
        fh.truncate(MAX_CASES_BYTES + 1)  # sparse: no disk used
    _refused(["--cases", str(big), "--list"], "over the", capsys)
    _refused(["--cases", "~no-such-user-dtsim/cases.yaml", "--list"], "no such user", capsys)


def test_a_tilde_path_is_the_home_folder(tmp_path, capsys, monkeypatch) -> None:
    """'--cases=~/set.yaml' reaches dtsim unexpanded (no shell expands a tilde after '='): it is the home
    folder's file, not a folder named '~' here."""
    (tmp_path / "set.yaml").write_bytes(DEFAULT_CASES.read_bytes())
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["validate", "--published", "--cases=~/set.yaml", "--list"]) == 0
    assert "llama3-8b-8xh100-nemo" in capsys.readouterr().out
