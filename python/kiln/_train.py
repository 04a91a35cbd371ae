"""kiln.train: the `kiln train` run from Python."""
import json
import os
import signal

import numpy as np

from . import _C
from ._tensor import _a_type
from .models import _sets_of


def _flags(options):
    # The keywords are the long flags of `kiln train`, read from the command's own definition: an
    # unknown one is named whatever its value (None would otherwise pass silently as "the default"),
    # and a true/false flag given another type is named, not turned into a stray word ("0").
    known = dict(_C._train_options())  # keyword -> whether it is a flag that takes no value
    unknown = [k for k in options if k not in known]
    if unknown:
        raise _C.KilnValueError(f"kiln.train: unknown option(s) {', '.join(unknown)} (help=True lists the "
                                "options; each is a flag of kiln train)")
    args = []
    for key, value in options.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if known[key] and not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"kiln.train: {key} is a true/false option; give True or False, got the "
                            f"{type(value).__name__} {value!r}")
        if key == "seed" and isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            value = int(value) % 2**64  # as kiln.manual_seed (and torch): -1 is 2**64 - 1; the flag takes 0..2**64-1
        if isinstance(value, (bool, np.bool_)):
            args.append(f"{flag}={'true' if value else 'false'}")
        elif key == "set":  # as kiln.models.create takes it: a dict, "a=1,b=2" or a list of "key=value"
            sets = _sets_of(value, "kiln.train")
            if not sets:  # as epochs=[]: no flag at all would pass silently as "the default"
                raise _C.KilnValueError(f"kiln.train: set={value!r} gives no value (leave it out for the default)")
            for s in sets:
                args += ["--set", s]
        elif key in ("betas", "mean", "std") and isinstance(value, (list, tuple)):  # one flag: --betas B1,B2
            if not value:  # as epochs=[]: "--betas ''" would be refused for its empty number, not for this
                raise _C.KilnValueError(f"kiln.train: {key}=[] gives no value (leave it out for the default)")
            args += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, (list, tuple)):
            if not value:  # no flag at all would pass silently as "the default"
                raise _C.KilnValueError(f"kiln.train: {key}=[] gives no value (leave it out for the default)")
            for v in value:
                args += [flag, os.fspath(v) if hasattr(v, "__fspath__") else str(v)]
        else:
            args += [flag, os.fspath(value) if hasattr(value, "__fspath__") else str(value)]
    return args


def train(model="resnet20", *, out=None, callback=None, **options):
    """Trains as `kiln train` does, in this process, with the same options: each keyword is the flag
    of the same name (epochs=2 is --epochs 2, max_steps is --max-steps, augment=False is
    --no-augment, text=[...] repeats --text, set={"hidden": 64} or set="hidden=64,num_layers=2" is
    --set for each field, as kiln.models.create takes set=); `out` is the
    run directory (metrics.jsonl, summary.json, checkpoints, model.safetensors), required unless
    help=True.

    callback(record) gets each training and evaluation line of metrics.jsonl as a dict (training lines
    with "loss", "lr", "samples_per_s", ...; evaluation lines with "eval_loss"), not the
    {"stopped": ...} line a signal stop writes there (the KeyboardInterrupt or SystemExit below tells
    of it); returning False saves a checkpoint and
    stops the run (train then returns {"stopped": True, "saved": CHECKPOINT}). An interrupt (Ctrl-C,
    a notebook's stop button) saves a checkpoint, stops, and raises KeyboardInterrupt; SIGTERM and
    SIGHUP (a scheduler ending the job, a dropped terminal) save, stop and raise SystemExit(128 +
    signal), so the code after the call does not run on a half-finished run and the process ends
    with the status a shell gives a killed one (143 for SIGTERM); under kiln launch on the rank that
    caught the signal only: the ranks that stop with it return {"stopped": True, "saved": CHECKPOINT},
    as their `kiln train` exits 0. train(..., resume="auto")
    continues from the checkpoint.

    Returns the run's summary.json as a dict (help=True prints the options and returns None); under
    kiln launch every rank returns rank 0's summary (which rank 0 alone writes) once rank 0 wrote its
    outputs (KilnError on every rank when it could not), and a stop's saved
    checkpoint is rank 0's path on every rank. A run
    that fails raises kiln.KilnError with its messages; a bad option or config (what `kiln train`
    refuses with exit code 2 before any work: an unknown keyword, whatever its value, batch=0,
    momentum=1.5; also what the run cannot start from: a missing data file or checkpoint, an `out`
    another run holds, a failed rendezvous) raises kiln.KilnValueError (a ValueError). A true/false option given anything but
    a bool (augment=0), or a callback that returns something other than None, True or False, raises
    TypeError; a list for a one-value option is an error, as is an empty list or set= ("", [], {}). An int seed is taken modulo 2**64, as
    kiln.manual_seed does (seed=-1 is 2**64 - 1); --seed itself refuses values outside 0..2**64 - 1."""
    if not isinstance(model, str):
        # str(model) of a Python module would reach --model as its printout
        raise TypeError("kiln.train: model must be a model name, one of kiln.models.names() "
                        f"({', '.join(_C._model_names())}), not {_a_type(model)}; kiln.train runs "
                        "`kiln train`, whose models are built in C++. "
                        "A Python module (kiln.nn.Module) trains in a loop of its own: loss.backward(), opt.step() "
                        "with kiln.optim, as README.md's Python example shows")
    if out is None and options.get("help") is not True:
        # only help=True runs nothing; Python's own "missing keyword-only argument" would be the
        # message had `out` no default, but help=True alone must work as docs/python.md shows it
        raise TypeError("kiln.train: give out=, the run directory (metrics.jsonl, summary.json, checkpoints); "
                        "only help=True needs none")
    args = ["--model", str(model)] + (["--out", os.fspath(out)] if out is not None else []) + _flags(options)
    r = _C._train(args, callback)
    if "help" in r:  # help=True: the options of kiln train (each a keyword here)
        print(r["help"])
        return None
    if r["stop_signal"] == signal.SIGINT:
        raise KeyboardInterrupt(f"kiln.train: interrupted; saved {r['saved'] or 'nothing'}; "
                                "continue with resume='auto'")
    if r["stop_signal"] in (signal.SIGTERM, signal.SIGHUP):
        # the run printed what it saved and how to continue; the job is being ended: end it
        raise SystemExit(128 + r["stop_signal"])
    if r["returncode"] != 0:
        detail = "; ".join(r["errors"]) or f"exit code {r['returncode']} (see the messages above)"
        # exit code 2 is the command's "cannot start from what it was given, before any work" (batch=0,
        # momentum=1.5, a missing data file or checkpoint, an --out that holds a run, a failed
        # rendezvous): a bad argument, as the options the flag parser refuses
        error = _C.KilnValueError if r["returncode"] == 2 else _C.KilnError
        raise error(f"kiln.train: {detail}")
    # the run's own outcome, on every rank: only rank 0 writes summary.json, and a shared out may hold
    # a previous run's
    if r["finished"]:
        return json.loads(r["summary"])
    return {"stopped": True, "saved": r["saved"]}


def report(*inputs, out=None, title=None):
    """The page `kiln report` writes: run directories of kiln train (curves overlaid) and benchmark
    JSON files. Writes it to `out` when given and returns the HTML (in a notebook:
    IPython.display.HTML(kiln.report("runs/a", "runs/b"))). What could not be read is named in a
    warning and on the page."""
    import warnings

    paths = [os.fspath(p) for p in inputs]
    if not paths:
        raise _C.KilnValueError("kiln.report: give at least one run directory or benchmark JSON file")
    for p in paths:
        if not os.path.exists(p):
            raise _C.KilnValueError(f"kiln.report: {p}: no such run directory or file")
    html, notes = _C._report(paths, title or "kiln report: " + " ".join(os.path.basename(p.rstrip("/")) for p in paths))
    for n in notes:
        warnings.warn(n, stacklevel=2)
    if out is not None:
        with open(os.fspath(out), "w") as f:
            f.write(html)
    return html
