# kiln report's page as a browser draws it: headless Chromium (Debian's chromium) renders a real
# run's report and a benchmark report without console errors; the rendered DOM holds every series
# with its points, and the screenshot shows the series' colours inside the charts.
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

SERIES_BLUE = np.array([0x1f, 0x77, 0xb4]) / 255.0


def kiln(*args):
    r = subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def chromium(*args):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                           *args], capture_output=True, text=True, timeout=120)


def render(html, tmp_path):
    png = tmp_path / (html.stem + ".png")
    shot = chromium(f"--screenshot={png}", "--window-size=1300,1400", html.as_uri())
    assert png.exists(), shot.stderr[-2000:]
    console = [line for line in shot.stderr.splitlines() if "CONSOLE" in line]
    assert console == []  # no script errors, no resource that failed to load
    dom = chromium("--dump-dom", html.as_uri()).stdout
    import matplotlib.image
    pixels = matplotlib.image.imread(str(png))[..., :3]
    return dom, pixels


@needs_chromium
def test_run_report_in_a_browser(tmp_path):
    run = tmp_path / "run"
    kiln("train", "--model", "resnet20", "--batch", "16", "--limit-train", "64", "--limit-eval", "32", "--log-every", "1",
         "--threads", "2", "--workers", "0", "--progress", "lines", "--out", run)
    dom, pixels = render(run / "report.html", tmp_path)  # the page kiln train refreshed itself
    assert 'data-series="train" data-points="4"' in dom and 'data-series="eval" data-points="1"' in dom
    assert dom.count("<svg") >= 5
    blue = np.all(np.abs(pixels - SERIES_BLUE) < 0.08, axis=-1).sum()
    assert blue > 300  # the first series of each chart is drawn in blue


@needs_chromium
def test_bench_report_in_a_browser(tmp_path):
    (tmp_path / "scaling.json").write_text(json.dumps({"bench": "scaling", "model": "resnet20", "rows": [
        {"ranks": 1, "samples_per_s": 100, "efficiency": 1.0}, {"ranks": 2, "samples_per_s": 185, "efficiency": 0.925},
        {"ranks": 4, "samples_per_s": 340, "efficiency": 0.85}]}))
    (tmp_path / "allreduce.json").write_text(json.dumps({"benchmark": "allreduce", "backend": "tcp", "ranks": 2, "rows": [
        {"bytes": 2 ** k, "algbw_GBps": 0.01 * k, "busbw_GBps": 0.01 * k} for k in range(10, 27, 4)]}))
    # and a real benchmark's JSON, measured here
    kiln("bench", "train", "--model", "resnet20", "--batch", "8", "--steps", "1", "--warmup", "0", "--amp", "off", "bf16",
         "--json", tmp_path / "train.json")
    out = tmp_path / "bench.html"
    kiln("report", tmp_path / "scaling.json", tmp_path / "allreduce.json", tmp_path / "train.json", "--out", out)
    dom, pixels = render(out, tmp_path)
    assert 'data-series="measured" data-points="3"' in dom and 'data-series="bus bandwidth" data-points="5"' in dom
    assert 'data-series="bars" data-points="2"' in dom and "resnet20 bf16" in dom
    assert np.all(np.abs(pixels - SERIES_BLUE) < 0.08, axis=-1).sum() > 200


def test_report_of_unreadable_input_names_it(tmp_path):
    run = tmp_path / "cut"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step":1,"loss":2.0,"lr":0.1}\n{"step":2,"lo')
    (tmp_path / "odd.json").write_text('{"benchmark":"mystery"}')
    r = kiln("report", run, tmp_path / "odd.json", "--out", tmp_path / "x.html")
    assert "metrics.jsonl:2" in r.stderr and "unknown kind" in r.stderr
    page = (tmp_path / "x.html").read_text()
    assert "metrics.jsonl:2" in page and 'data-series="train" data-points="1"' in page
    bad = subprocess.run([sys.executable, "-m", "kiln", "report", tmp_path / "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "nope: no such run directory" in bad.stderr


def test_report_from_python(tmp_path):
    import kiln as k

    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step":1,"loss":2.0,"lr":0.1}\n{"step":2,"loss":1.5,"lr":0.1}\n{"step":3,"lo')
    with pytest.warns(UserWarning, match="metrics.jsonl:3"):
        html = k.report(run, out=tmp_path / "p.html")
    assert 'data-series="train" data-points="2"' in html and (tmp_path / "p.html").read_text() == html
    with pytest.raises(ValueError, match="nope"):
        k.report(tmp_path / "nope")
