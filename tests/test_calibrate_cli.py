"""`dtsim calibrate` arguments: bad input is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import pytest

from calibrate.cli import main, slug


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--device", "tpu"], "--device"),
        (["--gpus", "0"], "--gpus"),
        (["--gpus", "two"], "--gpus"),
        (["--only", "gemm,disk"], "--only"),
        (["--out", "profile.txt", "--device", "cpu"], "--out"),
        (["--bogus"], "unrecognized arguments"),
        (["--report", "/nonexistent/profile.json"], "--report"),
        (["--device", "cpu", "--gpus", "1000"], "--gpus"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, needle, capsys):
    if argv[-1] == "1000":
        pytest.importorskip("torch")  # the worker limit is checked once torch has said which device
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err and "Traceback" not in err


def test_cuda_without_gpu_is_a_user_error(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device" in err and "--device cpu" in err


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "--resume" in capsys.readouterr().out


def test_slug():
    assert slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert slug("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.0GHz") == "intel-xeon-platinum-8480"
    assert slug("AMD EPYC") == "amd-epyc"
