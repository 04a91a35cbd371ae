# kiln train's TensorBoard event files, read back by the real tensorboard package: every scalar tag,
# step and value of metrics.jsonl, and a resumed run's curve continuous (no step twice, none back).
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

RUN = ["--model", "resnet20", "--batch", "16", "--limit-train", "96", "--limit-eval", "32", "--epochs", "1",
       "--log-every", "1", "--threads", "2", "--seed", "2", "--workers", "0", "--progress", "lines",
       "--save-every", "2", "--no-save-epochs"]


def train(out, *extra):
    r = subprocess.run([sys.executable, "-m", "kiln", "train", *RUN, "--out", str(out), *extra],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def read(out):
    acc = event_accumulator.EventAccumulator(str(out), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_every_scalar_as_written(tmp_path):
    train(tmp_path)
    got = read(tmp_path)
    lines = metrics(tmp_path)
    train_lines = [m for m in lines if "eval_loss" not in m]
    evals = [m for m in lines if "eval_loss" in m]
    assert len(train_lines) == 6 and len(evals) == 1
    for key, tag in [("loss", "train/loss"), ("lr", "train/lr"), ("train_accuracy", "train/accuracy"),
                     ("samples_per_s", "train/samples_per_s"), ("data_wait_s", "train/data_wait_s")]:
        assert [s for s, _ in got[tag]] == [m["step"] for m in train_lines], tag
        np.testing.assert_array_equal([v for _, v in got[tag]], np.float32([m[key] for m in train_lines]), tag)
    assert got["eval/loss"] == [(evals[0]["step"], np.float32(evals[0]["eval_loss"]))]
    assert got["eval/accuracy"] == [(evals[0]["step"], np.float32(evals[0]["eval_accuracy"]))]
    # the training epoch's time, though the evaluation line carries it
    assert got["train/epoch_seconds"] == [(evals[0]["step"], np.float32(evals[0]["epoch_seconds"]))]
    assert "eval/epoch_seconds" not in got
    # and OUT/report.html, refreshed at the evaluation and at the end: the same points
    html = (tmp_path / "report.html").read_text()
    assert 'data-series="train" data-points="6"' in html and 'data-series="eval" data-points="1"' in html


def test_resumed_run_is_continuous(tmp_path):
    train(tmp_path)
    straight = read(tmp_path)["train/loss"]
    # As after a crash at step 5: the checkpoint of step 6 never written; resume from step 4.
    for c in glob.glob(str(tmp_path / "checkpoints" / "step-00000000[56].kiln")):
        os.remove(c)
    train(tmp_path, "--resume", "auto")
    assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 2
    resumed = read(tmp_path)["train/loss"]
    assert [s for s, _ in resumed] == [1, 2, 3, 4, 5, 6]  # steps 5 and 6 once each, in order
    assert resumed == straight  # and the same values (exact resume)


def test_no_tensorboard_and_a_fresh_start(tmp_path):
    train(tmp_path, "--no-tensorboard")
    assert not glob.glob(str(tmp_path / "events.out.tfevents.*"))
    train(tmp_path, "--overwrite")
    train(tmp_path, "--overwrite")  # starting over in the same folder replaces the old files
    assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 1


def test_a_fresh_run_without_tensorboard_removes_the_old_curves(tmp_path):
    train(tmp_path)
    train(tmp_path, "--overwrite", "--no-tensorboard")
    assert not glob.glob(str(tmp_path / "events.out.tfevents.*"))


def test_a_resume_without_tensorboard_warns_of_the_old_curves(tmp_path):
    train(tmp_path)
    for c in glob.glob(str(tmp_path / "checkpoints" / "step-00000000[56].kiln")):
        os.remove(c)
    r = subprocess.run([sys.executable, "-m", "kiln", "train", *RUN, "--out", str(tmp_path), "--resume", "auto",
                        "--no-tensorboard"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--no-tensorboard on a run resumed at step 4" in r.stderr
    assert "still hold the steps logged after it" in r.stderr
