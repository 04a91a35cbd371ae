# bench/train_vs_torch.py's checks that need no timing: bad flags are argparse errors (exit 2, one line,
# before any run), and the rule that marks a row unreliable (a busy machine, widely spread rounds).
import importlib.util
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
SCRIPT = os.path.join(BENCH, "train_vs_torch.py")


def load_script():
    spec = importlib.util.spec_from_file_location("train_vs_torch", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("args, message", [
    (["--rounds", "0"], "argument --rounds: want a whole number >= 1, got 0"),
    (["--case", "5"], "argument --case: invalid choice: 5"),
    (["--threads", "0"], "argument --threads: want a whole number >= 1, got 0"),
    (["--threads", "abc"], "argument --threads: want a whole number >= 1, got 'abc'"),
    (["--steps", "-1"], "argument --steps: want a whole number >= 1, got -1"),
    (["--json", "/nonexistent-dir/x.json"], "--json /nonexistent-dir/x.json: the directory /nonexistent-dir does not exist"),
])
def test_train_vs_torch_bad_flags_are_argparse_errors(args, message):
    r = subprocess.run([sys.executable, SCRIPT, "--kiln", "/nonexistent/kiln", *args], capture_output=True, text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_train_vs_torch_flags_a_busy_machine_or_spread_rounds():
    m = load_script()
    assert m.why_unreliable([0.8, 0.85, 0.9], 0.5, 1.0, 2) == []
    assert m.why_unreliable([0.8, 0.85, 0.9], None, None, 2) == []  # no load average on this system
    busy = m.why_unreliable([0.8, 0.85, 0.9], 0.5, 9.8, 2)
    assert len(busy) == 1 and "load average 9.8 above the 2 cores" in busy[0]
    spread = m.why_unreliable([0.5, 0.85, 0.9], 0.5, 1.0, 2)
    assert len(spread) == 1 and "round ratios spread 1.80x" in spread[0]


def test_train_vs_torch_its_own_threads_do_not_make_the_machine_busy():
    # The README's setup: 2 cores, --threads 2. Its own runs hold the 1-minute load near 2 (it was
    # flagged unreliable by its own load); only what is above cores + its threads is someone else's.
    m = load_script()
    assert m.why_unreliable([0.8, 0.85, 0.9], 2.1, 3.6, 2, 2) == []
    busy = m.why_unreliable([0.8, 0.85, 0.9], 2.1, 4.5, 2, 2)
    assert len(busy) == 1 and "load average 4.5 above the 2 cores plus the benchmark's own 2 threads" in busy[0]
