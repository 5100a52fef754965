"""report.html: one self-contained page (summary, embedded charts, resolved YAML, Perfetto instructions),
checked as text and rendered in a real headless browser."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from sim.api import simulate, write_results
from sim.errors import ScenarioError
from sim.outputs.report import PERFETTO_URL, report_html, write_report
from sim.scenario.load import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "scenarios" / "seed-pipeline.yaml"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HAS_CHROMIUM = Path(CHROMIUM).exists()
CHROME_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("seed")
    write_results(simulate(load_scenario(SEED)), out, charts=True)
    return out


def test_report_is_self_contained_with_summary_charts_yaml_and_perfetto(run_dir):
    path = write_report(run_dir)
    assert path == run_dir / "report.html"
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    charts = sorted(p.stem for p in run_dir.glob("*.png"))
    assert charts == ["gantt", "memory", "pipeline"]
    assert page.count('src="data:image/png;base64,') == len(charts)
    assert "110.000 ms" in page and "27.3%" in page  # the seed pipeline's step time and bubble
    assert "name: seed-pipeline" in page and "resolved by dtsim" in page  # the resolved YAML
    assert f'href="{PERFETTO_URL}"' in page and 'href="trace.json"' in page and "Open trace file" in page
    # nothing is loaded from elsewhere: every src is a data: URI, the only external href is Perfetto's
    assert all(src.startswith("data:") for src in re.findall(r'src="([^"]*)"', page))
    assert set(re.findall(r'href="(https?://[^"]*)"', page)) == {PERFETTO_URL}


def test_report_escapes_scenario_text(tmp_path):
    (tmp_path / "resolved.yaml").write_text("description: <script>alert(1)</script>\n")
    page = report_html(tmp_path)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_report_of_a_compare_folder_shows_its_table(tmp_path):
    (tmp_path / "compare.csv").write_text(
        "label,status,reason,step_time_s\na,ok,,1.5\nb,invalid,bad layout,\n"
    )
    page = report_html(tmp_path)
    assert "Comparison" in page and "bad layout" in page and 'class="bad"' in page


def test_report_needs_a_folder(tmp_path):
    with pytest.raises(ScenarioError, match="not a result folder"):
        write_report(tmp_path / "missing")


def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(dir=tmp_path)
    cmd = [CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def _console_errors(stderr: str) -> list[str]:
    """Console messages of any level (the report has no script, so any is a problem: an error, a blocked
    external load reported as a CSP violation), and network errors."""
    bad = (":CONSOLE", "Uncaught", "Refused to load", "Content Security Policy", "net::ERR_")
    return [line for line in stderr.splitlines() if any(b in line for b in bad)]


@pytest.mark.skipif(not HAS_CHROMIUM, reason="chromium not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    page = write_report(run_dir)
    shot = tmp_path / "report.png"
    res = _chromium([f"--screenshot={shot}", "--window-size=1280,2000", page.resolve().as_uri()], tmp_path)
    assert shot.exists(), res.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(shot)[..., :3]
    assert img.shape[:2] == (2000, 1280)
    dark = (img.mean(axis=2) < 0.9).mean()
    assert img.std() > 0.05 and dark > 0.02, "screenshot looks blank"
    assert not _console_errors(res.stderr)

    dom = _chromium(["--dump-dom", page.resolve().as_uri()], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('src="data:image/png;base64,') == 3
    assert "Timeline in Perfetto" in dom.stdout and "Resolved scenario" in dom.stdout
    assert not _console_errors(dom.stderr)


@pytest.mark.skipif(not HAS_CHROMIUM, reason="chromium not installed (apt-get install -y chromium)")
def test_console_check_catches_external_loads_and_script_errors(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text(report_html(tmp_path).replace("<body>", '<body><img src="https://example.com/x.png">'))
    res = _chromium(["--dump-dom", bad.resolve().as_uri()], tmp_path)
    assert any("example.com" in line for line in _console_errors(res.stderr))


def test_short_time_to_train_is_not_zero_days_and_synthetic_runs_show_no_tokens(tmp_path) -> None:
    from sim.cli import main
    from sim.units import format_days

    assert format_days(2.5) == "2.50 days" and format_days(0.5) == "12.0 h" and format_days(1 / 48) == "30.0 min"
    seed = str(Path(__file__).resolve().parent.parent / "scenarios" / "seed-pipeline.yaml")
    out = tmp_path / "r"
    assert main(["run", seed, "--out", str(out), "--no-charts", "--set", "simulation.steps=3"]) == 0
    html = (out / "report.html").read_text()
    assert "tokens/s" not in html  # a synthetic model has samples, not tokens
    assert "p50/p90/p99" in html
