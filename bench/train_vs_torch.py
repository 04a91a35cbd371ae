#!/usr/bin/env python3
"""Kiln's CPU training step against PyTorch eager on the same machine, alternated in one run.

The [cpu-speed] targets: ResNet-20 at batch 128 on 1x28x28 (Fashion-MNIST's shape) and 3x32x32 inputs,
and BERT-tiny masked-LM at 32 x 128, full steps (forward, backward, optimizer) with the same thread
count, Kiln at most 0.9x PyTorch's time. Each kernel set of Kiln this CPU supports is timed against
PyTorch limited to the same instruction set (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA and
MKL_ENABLE_INSTRUCTIONS), so an AVX-512 machine also gives an AVX2 comparison; that is a proxy for an
AVX2-only CPU, and the table says which CPU it ran on.

Kiln and PyTorch alternate within each round (the order flips every round) and each figure is the
median over rounds of each run's median step, so a slow patch of a shared machine hits both. Beside
it, the rounds' own ratios (each round's Kiln run over its PyTorch run, side by side in time): their
lowest, median and highest, which show how far the machine's drift moves the figure. The load average
(os.getloadavg) before and after each case goes in the table and the JSON; when it exceeds the cores
plus the benchmark's own --threads (the 1-minute average counts its own runs too) or the round ratios
spread more than 1.5x (highest/lowest), a warning says the figure is not to be trusted: "met" on an
overloaded machine proves nothing. The table names PyTorch's CPU capability (the
instruction set its kernels ran with) beside each row.

Run with a Python that has torch (PyPI):
  python bench/train_vs_torch.py [--kiln build/kiln] [--threads 2] [--rounds 3] [--json FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [  # name, kiln flags, peer script, peer flags, input label
    ("resnet20", ["--model", "resnet20", "--batch", "128", "--in-channels", "1", "--image-size", "28"],
     "torch_resnet20.py", ["--batch", "128", "--in-channels", "1", "--image-size", "28"], "128x1x28x28"),
    ("resnet20", ["--model", "resnet20", "--batch", "128", "--in-channels", "3", "--image-size", "32"],
     "torch_resnet20.py", ["--batch", "128", "--in-channels", "3", "--image-size", "32"], "128x3x32x32"),
    ("bert-tiny", ["--model", "bert-tiny", "--batch", "32", "--seq-len", "128"],
     "torch_bert_tiny.py", ["--batch", "32", "--seq-len", "128"], "32x128 tokens"),
]
# PyTorch's own switches for the instruction set of its kernels (ATen, oneDNN, MKL).
PEER_ISA = {
    "avx512": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
TARGET = 0.9
SPREAD_WARN = 1.5  # highest / lowest round ratio above which a row is flagged


def fail(msg):
    sys.exit(f"train_vs_torch: {msg}")


def run(cmd, env, what):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def kiln_step(a, env, flags, tmp):
    out = os.path.join(tmp, "kiln.json")
    run([a.kiln, "bench", "train", *flags, "--threads", str(a.threads), "--steps", str(a.steps), "--warmup",
         str(a.warmup), "--json", out], env, "kiln bench train")
    with open(out) as f:
        return json.load(f)["rows"][0]["median_ms"]


def peer_step(a, env, script, flags):
    out = run([sys.executable, os.path.join(HERE, "peer", script), *flags, "--threads", str(a.threads), "--steps",
               str(a.steps), "--warmup", str(a.warmup)], env, script)
    return json.loads(out.strip().splitlines()[-1])


def whole_number(least):
    """An argparse type: a whole number >= least, or an error naming what was given."""

    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"want a whole number >= {least}, got '{text}'")
        if v < least:
            raise argparse.ArgumentTypeError(f"want a whole number >= {least}, got {v}")
        return v

    return parse


def load():
    """The 1-minute load average, or None where the system has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def why_unreliable(round_ratios, load_before, load_after, cores, own_threads=0):
    """Why a row's figure is not to be trusted (empty: no reason): a load average above the cores plus
    the benchmark's own threads before or after its runs, or round ratios spread more than SPREAD_WARN
    (highest / lowest). The 1-minute load average counts the benchmark's own runs (`own_threads`
    busy threads, Kiln's or PyTorch's, one run at a time): on 2 cores with --threads 2 it is near 2
    from them alone, so only what is above cores + own_threads is another program's load."""
    why = []
    worst_load = max(x for x in (load_before, load_after, 0.0) if x is not None)
    if worst_load > cores + own_threads:
        why.append(f"load average {worst_load:.1f} above the {cores} cores plus the benchmark's own "
                   f"{own_threads} threads")
    if round_ratios and max(round_ratios) / min(round_ratios) > SPREAD_WARN:
        why.append(f"round ratios spread {max(round_ratios) / min(round_ratios):.2f}x (above {SPREAD_WARN}x)")
    return why


def supported_sets(kiln):
    sets = []
    for s in PEER_ISA:
        r = subprocess.run([kiln, "doctor"], env={**os.environ, "KILN_CPU_ISA": s}, capture_output=True, text=True)
        if r.returncode == 0 and "supports at most" not in r.stdout + r.stderr:
            sets.append(s)
    return sets


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "build", "kiln"), help="the kiln binary")
    ap.add_argument("--threads", type=whole_number(1), default=2, help="threads of both (default 2)")
    ap.add_argument("--rounds", type=whole_number(1), default=3, help="alternations of Kiln and PyTorch per case")
    ap.add_argument("--steps", type=whole_number(1), default=8, help="timed steps per run")
    ap.add_argument("--warmup", type=whole_number(0), default=2, help="untimed steps first, per run")
    ap.add_argument("--set", action="append", choices=list(PEER_ISA), help="kernel sets (default: all supported)")
    ap.add_argument("--case", action="append", type=int, choices=range(len(CASES)), metavar="{0,1,2}",
                    help="case indices (0: ResNet-20 1x28x28, 1: 3x32x32, 2: BERT-tiny)")
    ap.add_argument("--json", help="write the rows to this file")
    a = ap.parse_args()
    if a.json:  # checked before minutes of runs, as the bench_* programs check --json
        jdir = os.path.dirname(a.json) or "."
        if os.path.isdir(a.json):
            ap.error(f"--json {a.json} is a directory: name the JSON file to write")
        if not os.path.isdir(jdir):
            ap.error(f"--json {a.json}: the directory {jdir} does not exist")
        if not os.access(jdir, os.W_OK):
            ap.error(f"--json {a.json}: the directory {jdir} is not writable")
    if not os.access(a.kiln, os.X_OK):
        fail(f"--kiln {a.kiln}: not an executable (build first: cmake --build build)")
    try:
        import torch  # noqa: F401  (only to fail early, with a clear message)
    except ImportError:
        fail(f"{sys.executable} has no torch: run this with a Python that has it (pip install torch)")
    sets = a.set or supported_sets(a.kiln)
    if not sets:
        fail("this CPU supports neither the avx512 nor the avx2 kernel set; nothing to compare")
    cases = [CASES[i] for i in (a.case or range(len(CASES)))]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
    cores = os.cpu_count() or 1
    print(f"train_vs_torch: {cpu}; {cores} cores; {a.threads} threads; {a.rounds} rounds of Kiln and PyTorch "
          f"alternated, {a.warmup} warm-up + {a.steps} timed steps each; figure: median over rounds of each run's "
          f"median; load: 1-minute load average before/after each case (its own {a.threads} threads count in it; "
          f"unreliable above {cores} + {a.threads})")
    print(f"{'set':7} {'model':10} {'input':14} {'kiln ms':>9} {'torch ms':>9} {'kiln/torch':>11} "
          f"{'rounds: low/median/high':>24} {'torch isa':>9} {'load':>11}  target <= {TARGET}x")
    rows = []
    warnings = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in sets:
            kenv = {**os.environ, "KILN_CPU_ISA": s}
            penv = {**os.environ, **PEER_ISA[s]}
            for name, kflags, script, pflags, label in cases:
                kms, pms, peer = [], [], None
                load_before = load()
                for r in range(a.rounds):
                    order = [0, 1] if r % 2 == 0 else [1, 0]
                    for who in order:
                        if who == 0:
                            kms.append(kiln_step(a, kenv, kflags, tmp))
                        else:
                            peer = peer_step(a, penv, script, pflags)
                            pms.append(peer["median_ms"])
                load_after = load()
                k, p = statistics.median(kms), statistics.median(pms)
                ratio = k / p
                paired = [x / y for x, y in zip(kms, pms)]
                spread = f"{min(paired):.2f}/{statistics.median(paired):.2f}/{max(paired):.2f}x"
                loads = "-" if load_before is None else f"{load_before:.1f}/{load_after:.1f}"
                why = why_unreliable(paired, load_before, load_after, cores, a.threads)
                verdict = "met" if ratio <= TARGET else "not met"
                print(f"{s:7} {name:10} {label:14} {k:9.1f} {p:9.1f} {ratio:10.2f}x {spread:>24} "
                      f"{peer['cpu_capability']:>9} {loads:>11}  {verdict}{' (unreliable)' if why else ''}", flush=True)
                if why:
                    warnings.append(f"{s} {name} {label}: " + "; ".join(why))
                rows.append({"kernel_set": s, "model": name, "input": label, "threads": a.threads,
                             "kiln_ms": k, "peer_ms": p, "ratio": ratio, "target": TARGET, "met": ratio <= TARGET,
                             "kiln_runs_ms": kms, "peer_runs_ms": pms, "round_ratios": paired, "peer": peer["peer"],
                             "peer_cpu_capability": peer["cpu_capability"], "load_before": load_before,
                             "load_after": load_after, "unreliable": why})
    for w in warnings:
        print(f"train_vs_torch: warning: {w}: the machine was busy or drifting, so the ratio (and met/not met) is "
              "not to be trusted; rerun on an idle machine", file=sys.stderr)
    if a.json:
        try:
            with open(a.json, "w") as f:
                json.dump({"benchmark": "train_vs_torch", "cpu": cpu, "cores": cores, "rows": rows}, f, indent=2)
                f.write("\n")
        except OSError as e:
            fail(f"cannot write {a.json}: {e}")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
