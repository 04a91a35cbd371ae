# kiln.train is `kiln train`: the same flags, bit-for-bit the same losses as the command with the
# same seed, every metrics line streamed to the callback, a stop asked by the callback saves and
# resumes, and bad options are clear errors.
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import kiln

FORTUNES = "/usr/share/games/fortunes"


def cli(*args, cwd=None):
    r = subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], capture_output=True, text=True, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def free_port():
    # a loopback port free a moment ago (the kernel's pick): tests that run at once do not collide on it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lines(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(x) for x in f]


def losses(records):
    return [(r["step"], r["loss"]) for r in records if "loss" in r and "eval_loss" not in r]


RESNET = dict(epochs=1, max_steps=4, batch=16, limit_train=64, limit_eval=32, log_every=1, threads=2, seed=5,
              workers=0, progress="lines")


def as_flags(opts):
    out = []
    for k, v in opts.items():
        out += ["--" + k.replace("_", "-"), str(v)]
    return out


def test_resnet_steps_match_the_command(tmp_path):
    cli("train", "--model", "resnet20", "--out", tmp_path / "cli", *as_flags(RESNET))
    seen = []
    summary = kiln.train("resnet20", out=tmp_path / "py", callback=seen.append, **RESNET)
    want, got = losses(lines(tmp_path / "cli")), losses(lines(tmp_path / "py"))
    assert len(want) == 4 and got == want  # bit for bit: the same floats
    assert seen == lines(tmp_path / "py")  # every metrics line, as written
    assert summary["steps"] == 4 and os.path.exists(tmp_path / "py" / "model.safetensors")


@pytest.mark.skipif(not os.path.isdir(FORTUNES), reason="Debian's fortunes package is not installed")
def test_bert_tiny_steps_match_the_command(tmp_path):
    text = [f"{FORTUNES}/computers", f"{FORTUNES}/food"]
    cli("vocab", "--text", *text, "--size", "1500", "--out", tmp_path / "vocab.txt")
    opts = dict(task="mlm", vocab=tmp_path / "vocab.txt", seq_len=32, batch=8, max_steps=3, epochs=1, log_every=1,
                threads=2, seed=3, limit_eval=16, workers=0, optimizer="adamw", lr=1e-3)
    flags = as_flags(opts) + sum([["--text", t] for t in text], [])
    cli("train", "--model", "bert-tiny", "--out", tmp_path / "cli", *flags)
    kiln.train("bert-tiny", out=tmp_path / "py", text=text, **opts)
    want, got = losses(lines(tmp_path / "cli")), losses(lines(tmp_path / "py"))
    assert len(want) == 3 and got == want


@pytest.mark.skipif(not os.path.isdir(FORTUNES), reason="Debian's fortunes package is not installed")
def test_betas_and_eps_reach_the_optimizer_as_the_command_gives_them(tmp_path):
    # betas=(B1, B2) is --betas B1,B2; both are the run's config, and they change the steps
    text = f"{FORTUNES}/computers"
    cli("vocab", "--text", text, "--size", "1000", "--out", tmp_path / "vocab.txt")
    opts = dict(task="mlm", vocab=tmp_path / "vocab.txt", seq_len=32, batch=8, max_steps=3, epochs=1, log_every=1,
                threads=2, seed=3, limit_eval=8, workers=0, optimizer="lamb", lr=1e-3, text=text)
    cli("train", "--model", "bert-tiny", "--out", tmp_path / "cli", "--betas", "0.5,0.9", "--eps", "1e-3",
        *as_flags(opts))
    summary = kiln.train("bert-tiny", out=tmp_path / "py", betas=(0.5, 0.9), eps=1e-3, **opts)
    assert summary["config"]["betas"] == [0.5, 0.9] and summary["config"]["eps"] == 1e-3
    default = kiln.train("bert-tiny", out=tmp_path / "default", **opts)
    assert default["config"]["betas"] == [0.9, 0.999] and default["config"]["eps"] == 1e-6  # LAMB's
    want, got = losses(lines(tmp_path / "cli")), losses(lines(tmp_path / "py"))
    assert len(want) == 3 and got == want
    plain = losses(lines(tmp_path / "default"))
    assert plain[0] == got[0] and plain[2] != got[2]  # the same first batch, then other updates
    with pytest.raises(kiln.KilnValueError, match=r"--betas must be two numbers B1,B2, each in \[0, 1\), got 0.9,1"):
        kiln.train("bert-tiny", out=tmp_path / "x", betas=(0.9, 1.0), **opts)
    with pytest.raises(kiln.KilnValueError, match="--eps must be > 0 and finite, got 0"):
        kiln.train("bert-tiny", out=tmp_path / "x", eps=0.0, **opts)
    with pytest.raises(kiln.KilnValueError, match=r"--betas: for --optimizer adamw or lamb"):
        kiln.train("resnet20", out=tmp_path / "x", betas=(0.9, 0.99), max_steps=1)


def test_callback_stops_and_resume_continues(tmp_path):
    opts = dict(RESNET, max_steps=6)

    def stop_at_3(record):
        return record.get("step", 0) < 3

    r = kiln.train("resnet20", out=tmp_path / "run", callback=stop_at_3, **opts)
    assert r["stopped"] and os.path.basename(r["saved"]) == "step-000000003.kiln"
    assert max(s for s, _ in losses(lines(tmp_path / "run"))) == 3
    kiln.train("resnet20", out=tmp_path / "run", resume="auto", **opts)
    cli("train", "--model", "resnet20", "--out", tmp_path / "straight", *as_flags(opts))
    assert losses(lines(tmp_path / "run")) == losses(lines(tmp_path / "straight"))  # exact resume


def test_bad_options(tmp_path):
    with pytest.raises(ValueError, match=r"unknown option\(s\) epochz"):
        kiln.train("resnet20", out=tmp_path / "x", epochz=1)
    with pytest.raises(kiln.KilnError, match="add --no-nesterov"):
        kiln.train("resnet20", out=tmp_path / "m", momentum=0.0, max_steps=1)
    with pytest.raises(kiln.KilnError, match="model"):
        kiln.train("resnet-nope", out=tmp_path / "y", max_steps=1)
    with pytest.raises(ValueError, match="lr"):
        kiln.train("resnet20", out=tmp_path / "z", lr="fast")
    assert not os.path.exists(tmp_path / "x")


def test_a_python_module_for_model_is_a_type_error_naming_the_way(tmp_path):
    class Net(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = kiln.nn.Linear(2, 2)

    for model in (Net(), kiln.models.create("resnet20"), 20):
        with pytest.raises(TypeError, match=r"model name.*resnet20.*loop of its own"):
            kiln.train(model, out=tmp_path / "x", max_steps=1)
    assert not os.path.exists(tmp_path / "x")


def test_unknown_keywords_are_named_whatever_their_value(tmp_path):
    # None means "the flag's default" for a known option; an unknown one is still a mistake to name
    with pytest.raises(kiln.KilnValueError, match=r"unknown option\(s\) bogus_opt"):
        kiln.train("resnet20", out=tmp_path / "x", bogus_opt=None, max_steps=1)
    assert not os.path.exists(tmp_path / "x")


def test_true_false_options_take_a_bool(tmp_path):
    # which options are flags comes from kiln train's own definition
    options = dict(kiln._C._train_options())
    assert options["augment"] and options["no_augment"] and options["overwrite"] and options["skip_bad_samples"]
    assert not options["batch"] and not options["resume"]
    for kw in [dict(augment=0), dict(overwrite="yes"), dict(nesterov=1.0), dict(tensorboard=[True])]:
        (key,) = kw
        with pytest.raises(TypeError, match=f"kiln.train: {key} is a true/false option; give True or False"):
            kiln.train("resnet20", out=tmp_path / "x", max_steps=1, **kw)
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.parametrize("kw", [dict(batch=0), dict(epochs=0), dict(lr=-0.1), dict(momentum=1.5), dict(log_every=0),
                                dict(weight_decay=-1), dict(label_smoothing=1.5), dict(micro_batch=3),
                                dict(max_steps=-1), dict(warmup=-1), dict(keep_last=-1), dict(threads=2000)])
def test_a_bad_config_is_a_value_error(tmp_path, kw):
    # what `kiln train` refuses with exit code 2 before any work, as the flags its parser refuses
    options = dict(batch=16, max_steps=1, limit_train=32, limit_eval=16, progress="lines")
    options.update(kw)
    with pytest.raises(kiln.KilnValueError, match=next(iter(kw)).replace("_", "[-_]")):
        kiln.train("resnet20", out=tmp_path / "x", **options)


@pytest.mark.parametrize("seq_len", [0, -3])
def test_a_bert_seq_len_below_8_is_a_value_error_not_a_crash(tmp_path, seq_len):
    # 0 divided by zero sizing the batch (SIGFPE: the interpreter died); -3 first said the batch was too large
    (tmp_path / "v.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    (tmp_path / "t.tsv").write_text("x\ta\ny\ta\n")
    with pytest.raises(kiln.KilnValueError, match=rf"--seq-len must be at least 8, got {seq_len}") as e:
        kiln.train("bert-tiny", out=tmp_path / "x", task="classify", train_tsv=tmp_path / "t.tsv",
                   eval_tsv=tmp_path / "t.tsv", vocab=tmp_path / "v.txt", batch=2, max_steps=1, seq_len=seq_len)
    assert "largest tensor" not in str(e.value)


def test_callback_exception_saves_then_raises(tmp_path):
    # as a stop: the run saves, then the callback's own exception is raised, and resume="auto" goes on
    opts = dict(RESNET)  # 4 steps

    def boom(record):
        if record.get("step", 0) >= 2:
            raise ZeroDivisionError("from the callback")

    with pytest.raises(ZeroDivisionError, match="from the callback"):
        kiln.train("resnet20", out=tmp_path / "run", callback=boom, **opts)
    assert any(s.startswith("step-") for s in os.listdir(tmp_path / "run" / "checkpoints"))
    r = kiln.train("resnet20", out=tmp_path / "run", resume="auto", **opts)
    assert r["steps"] == 4


def test_a_diverged_run_raises_why(tmp_path):
    # the reason was on C stderr only (a notebook cell may not show it); the exception said "exit code 1"
    with pytest.raises(kiln.KilnError, match="the loss is (NaN|infinite) in the steps up to step"):
        kiln.train("resnet20", out=tmp_path / "run", **dict(RESNET, lr=1e30, momentum=0.0, nesterov=False))


def test_interrupt_saves_then_raises(tmp_path):
    import signal
    import threading

    first_line = threading.Event()

    def note(record):
        first_line.set()

    def interrupt():
        first_line.wait(60)
        os.kill(os.getpid(), signal.SIGINT)  # what a notebook's stop button sends

    t = threading.Thread(target=interrupt)
    t.start()
    opts = dict(RESNET, max_steps=0, limit_train=320)  # one epoch: 20 steps
    with pytest.raises(KeyboardInterrupt, match="saved .*step-"):
        kiln.train("resnet20", out=tmp_path / "run", callback=note, **opts)
    t.join()
    saved = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
    assert saved and saved[-1].startswith("step-")
    stopped_at = max(s for s, _ in losses(lines(tmp_path / "run")))
    assert stopped_at < 20
    # the interpreter is intact, and the run continues from the checkpoint to the end of the epoch
    r = kiln.train("resnet20", out=tmp_path / "run", resume="auto", **opts)
    assert r["steps"] == 20 and [s for s, _ in losses(lines(tmp_path / "run"))] == list(range(1, 21))


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_scheduler_signal_saves_then_ends_the_process(tmp_path, capfd, signame):
    # A scheduler's SIGTERM must not let the code after kiln.train run on a half-finished run as if
    # it were done: it saves, then raises SystemExit(128 + signal), the status of a killed process.
    import signal
    import threading

    sig = getattr(signal, signame)
    first_line = threading.Event()

    def note(record):
        first_line.set()

    def send():
        first_line.wait(60)
        os.kill(os.getpid(), sig)

    t = threading.Thread(target=send)
    t.start()
    opts = dict(RESNET, max_steps=0, limit_train=320)  # one epoch: 20 steps
    with pytest.raises(SystemExit) as stopped:
        kiln.train("resnet20", out=tmp_path / "run", callback=note, **opts)
    t.join()
    assert stopped.value.code == 128 + sig
    said = capfd.readouterr()
    assert f"caught {signame}" in said.out and "continue with resume='auto'" in said.out, said.out
    assert "--resume auto" not in said.out + said.err
    saved = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
    assert saved and saved[-1].startswith("step-")
    with open(tmp_path / "run" / "summary.json") as f:  # the stop's: a reader sees where the run stopped
        summary = json.load(f)
    assert summary["stopped"] == signame and summary["last_checkpoint"].endswith(saved[-1])


def test_a_signal_stop_with_a_moved_out_still_ends_the_process(tmp_path):
    # The stop is a signal's whatever else failed at it (--out moved away): SystemExit, not KilnError.
    import signal

    def move_then_signal(record):
        if not (tmp_path / "moved").exists():
            os.rename(tmp_path / "run", tmp_path / "moved")
            os.kill(os.getpid(), signal.SIGTERM)

    opts = dict(RESNET, max_steps=0, limit_train=320)
    with pytest.raises(SystemExit) as stopped:
        kiln.train("resnet20", out=tmp_path / "run", callback=move_then_signal, **opts)
    assert stopped.value.code == 128 + signal.SIGTERM


def test_eval_reads_a_bert_mlm_state_dict_saved_from_python(tmp_path):
    # kiln.save(model.state_dict()) writes the tied decoder as Hugging Face lists it; kiln eval reads
    # it as kiln forward does: equal to the word embeddings, or refused naming both.
    (tmp_path / "c.txt").write_text("".join(f"the quick brown fox jumps over the lazy dog {i} and again\n"
                                            for i in range(40)))
    cli("vocab", "--text", tmp_path / "c.txt", "--size", "64", "--out", tmp_path / "vocab.txt")
    size = sum(1 for _ in open(tmp_path / "vocab.txt"))
    m = kiln.models.create("bert-tiny-mlm", set={"vocab_size": size})
    kiln.save(m, tmp_path / "model.st")
    kiln.save(m.state_dict(), tmp_path / "sd.st")
    assert "cls.predictions.decoder.weight" in kiln.load(tmp_path / "sd.st")
    flags = ["eval", "--model", "bert-tiny-mlm", "--set", f"vocab_size={size}", "--task", "mlm", "--text",
             tmp_path / "c.txt", "--vocab", tmp_path / "vocab.txt", "--seq-len", "16"]
    got = [json.loads(cli(*flags, "--weights", tmp_path / f"{w}.st", "--out", tmp_path / f"{w}.json").stdout and
                      open(tmp_path / f"{w}.json").read()) for w in ("model", "sd")]
    assert got[0]["test_loss"] == got[1]["test_loss"]
    sd = m.state_dict()
    sd["cls.predictions.decoder.weight"] = sd["cls.predictions.decoder.weight"] + 1.0
    kiln.save(sd, tmp_path / "untied.st")
    r = subprocess.run([sys.executable, "-m", "kiln", *map(str, flags), "--weights", tmp_path / "untied.st"],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "'cls.predictions.decoder.weight' differs from 'bert.embeddings.word_embeddings.weight'" in r.stderr


def test_seed_is_taken_modulo_2_64_as_manual_seed(tmp_path):
    # kiln.manual_seed(-1) is 2**64 - 1 (torch's rule); kiln.train(seed=...) takes ints the same way,
    # while `kiln train --seed` refuses a value outside 0..2**64 - 1 (it was clamped to 2**64 - 1).
    opts = dict(RESNET, max_steps=1, limit_train=16, limit_eval=16)
    runs = {}
    for name, seed in (("neg", -1), ("wrapped", 2**64 + 5), ("five", 5)):
        runs[name] = kiln.train("resnet20", out=tmp_path / name, **dict(opts, seed=seed))["config"]["seed"]
    assert runs == {"neg": 2**64 - 1, "wrapped": 5, "five": 5}
    for bad in ("-1", str(2**64 + 1)):
        with pytest.raises(kiln.KilnValueError, match="--seed"):
            kiln.train("resnet20", out=tmp_path / "bad", **dict(opts, seed=bad))


def test_clip_grad_norm_is_logged_and_label_smoothing_1_is_taken(tmp_path):
    # --clip-grad-norm's norm was computed and thrown away: each metrics line (and TensorBoard) carries it
    # as grad_norm; --label-smoothing 1 was refused though torch's cross_entropy (and Kiln's) takes it
    out = tmp_path / "run"
    kiln.train("resnet20", out=out, clip_grad_norm=0.5, label_smoothing=1.0, tensorboard=True, **RESNET)
    steps = [r for r in lines(out) if "loss" in r and "eval_loss" not in r]
    assert len(steps) == 4
    for r in steps:
        assert isinstance(r["grad_norm"], float) and r["grad_norm"] > 0, r
    events = [p for p in os.listdir(out) if p.startswith("events.out.tfevents.")]
    assert events and b"train/grad_norm" in open(out / events[0], "rb").read()
    plain = kiln.train("resnet20", out=tmp_path / "plain", **RESNET)
    assert plain["steps"] == 4 and all("grad_norm" not in r for r in lines(tmp_path / "plain"))


def test_config_files_and_keywords_agree(tmp_path):
    # {"no_augment": true} in a --config file turned augmentation on: it is what no_augment=True is
    opts = dict(RESNET, max_steps=1, limit_train=16, limit_eval=16)
    by_keyword = kiln.train("resnet20", out=tmp_path / "kw", no_augment=True, **opts)["config"]
    (tmp_path / "c.json").write_text('{"no_augment": true, "set": {"zero_init_residual": true}}')
    by_file = kiln.train("resnet20", out=tmp_path / "file", config=tmp_path / "c.json", **opts)["config"]
    assert by_keyword["augment"] is False and by_file["augment"] is False
    assert by_file["set"] == ["zero_init_residual=true"]
    # set= as kiln.models.create takes it: "a=1,b=2" is two fields, not one value "1,b=2"
    by_string = kiln.train("resnet20", out=tmp_path / "str", set="zero_init_residual=1, num_classes=12", **opts)
    assert by_string["config"]["set"] == ["zero_init_residual=1", "num_classes=12"]


def test_empty_lists_and_empty_config_arrays_are_refused(tmp_path):
    # epochs=[] was no flag at all; {"epochs": []} in a config file killed the interpreter in CLI11's callback
    with pytest.raises(kiln.KilnValueError, match=r"kiln.train: epochs=\[\] gives no value"):
        kiln.train("resnet20", out=tmp_path / "x", epochs=[], max_steps=1)
    # betas=[] (one flag of several values, as mean= and std=) too, not "--betas ''" refused as a number
    for key in ("betas", "mean", "std"):
        with pytest.raises(kiln.KilnValueError, match=rf"kiln.train: {key}=\[\] gives no value"):
            kiln.train("resnet20", out=tmp_path / "x", max_steps=1, **{key: []})
    for key in ("epochs", "lr", "resume", "model"):
        (tmp_path / "c.json").write_text(json.dumps({key: []}))
        with pytest.raises(kiln.KilnValueError, match=f"'{key}' takes one value, got 0"):
            kiln.train("resnet20", out=tmp_path / "x", config=tmp_path / "c.json", max_steps=1)
    assert not os.path.exists(tmp_path / "x")


def test_set_takes_numpy_scalars(tmp_path):
    # set= refused np.int64 and np.float32 ("expected a number"), and np.bool_ with "is a bool_,
    # expected a number or a bool": a value read from an array is a number (or a bool) as any other
    np = pytest.importorskip("numpy")
    m = kiln.models.create("bert-tiny", set={"num_layers": np.int64(1), "hidden_dropout": np.float32(0.1),
                                             "attention_dropout": np.float64(0.25), "recompute": np.bool_(True)})
    assert m._recipe[0] == ["num_layers=1", "hidden_dropout=0.1", "attention_dropout=0.25", "recompute=true"]
    r = kiln.models.create("resnet20", set={"num_classes": np.int32(7), "zero_init_residual": np.bool_(False)})
    assert r._recipe[0] == ["num_classes=7", "zero_init_residual=false"]
    # kiln.train passes them on as the same --set values: the engine's own check names the field
    with pytest.raises(kiln.KilnValueError, match="num_classes=0: must be at least 1"):
        kiln.train("resnet20", out=tmp_path / "x", max_steps=1,
                   set={"zero_init_residual": np.bool_(True), "num_classes": np.int64(0)})
    with pytest.raises(TypeError, match="set\\['num_classes'\\] is a complex128"):
        kiln.models.create("resnet20", set={"num_classes": np.complex128(1)})


@pytest.mark.parametrize("empty", ["", "  ", [], {}])
def test_an_empty_set_is_refused(tmp_path, empty):
    # set="" and set=[] gave no --set at all and passed silently, as epochs=[] did before it was refused
    with pytest.raises(kiln.KilnValueError, match="kiln.train: set=.* gives no value"):
        kiln.train("resnet20", out=tmp_path / "x", max_steps=1, set=empty)
    assert not os.path.exists(tmp_path / "x")


def test_a_second_run_in_another_thread_is_refused_and_leaves_the_first_alone(tmp_path):
    # Two kiln.train calls at once in one process shared the random generator (each run's losses
    # changed with the other's draws) and the process-wide signal handlers (each put back what it had
    # found, out of order, and Ctrl-C stayed ignored afterwards). The second is refused, naming the
    # thread of the first; the first trains as it would alone, and Ctrl-C works after both.
    import signal
    import threading
    import time

    opts = dict(RESNET, max_steps=3, threads=1)
    handler = signal.getsignal(signal.SIGINT)
    kiln.train("resnet20", out=tmp_path / "solo", **opts)
    second = {}

    def second_run():
        try:
            second["result"] = kiln.train("resnet20", out=tmp_path / "second", **opts)
        except BaseException as e:
            second["error"] = e

    def on_line(record):
        if "started" not in second:  # while the first run is going: its first metrics line
            second["started"] = True
            t = threading.Thread(target=second_run)
            t.start()
            t.join(300)

    kiln.train("resnet20", out=tmp_path / "first", callback=on_line, **opts)
    assert "result" not in second, "the second run was not refused"
    assert isinstance(second.get("error"), kiln.KilnError), second
    msg = str(second["error"])
    assert f"kiln.train is already running in this process (thread {threading.get_native_id()})" in msg
    assert "run them one after another or in separate processes" in msg
    assert not os.path.exists(tmp_path / "second" / "metrics.jsonl")
    assert losses(lines(tmp_path / "first")) == losses(lines(tmp_path / "solo"))
    # Ctrl-C raises KeyboardInterrupt again (the run's handler swallowed it when restored out of order)
    assert signal.getsignal(signal.SIGINT) is handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
    # and a run after the first one is not refused
    assert kiln.train("resnet20", out=tmp_path / "after", **opts)["steps"] == 3


def test_a_run_started_from_the_running_runs_callback_is_refused_as_such(tmp_path):
    seen = {}

    def again(record):
        if "error" not in seen:
            try:
                kiln.train("resnet20", out=tmp_path / "inner", **dict(RESNET, max_steps=1))
            except kiln.KilnError as e:
                seen["error"] = str(e)

    kiln.train("resnet20", out=tmp_path / "outer", callback=again, **dict(RESNET, max_steps=2))
    assert "from inside the running kiln.train" in seen["error"], seen


def test_a_run_leaves_the_thread_count_and_the_default_generator_as_they_were(tmp_path):
    # the run set the process's threads (--threads) and reseeded the default generator (--seed) and
    # left them so: after train(threads=1), get_num_threads() was 1; after train(seed=5), kiln.rand
    # drew another stream than the caller's. Both are put back however the run ends.
    opts = dict(RESNET, threads=1, max_steps=1, limit_train=16, limit_eval=16)
    original = kiln.get_num_threads()
    before = 2 if original == 1 else original  # not the run's 1
    kiln.set_num_threads(before)
    kiln.manual_seed(0)
    kiln.rand(3)  # the stream has moved on: its position is put back too, not only its seed
    want = kiln.rand(3).tolist()

    def stop_with(exc):
        def callback(record):
            raise exc

        return callback

    runs = [
        (dict(), None),
        (dict(lr=1e30, momentum=0.0, nesterov=False, max_steps=4, limit_train=64), kiln.KilnError),  # diverges
        (dict(callback=stop_with(KeyboardInterrupt("from the callback"))), KeyboardInterrupt),
    ]
    for i, (extra, raises) in enumerate(runs):
        kiln.manual_seed(0)
        kiln.rand(3)
        if raises is None:
            kiln.train("resnet20", out=tmp_path / str(i), **dict(opts, **extra))
        else:
            with pytest.raises(raises):
                kiln.train("resnet20", out=tmp_path / str(i), **dict(opts, **extra))
        assert kiln.get_num_threads() == before, extra
        assert kiln.rand(3).tolist() == want, extra
    kiln.set_num_threads(original)


def test_every_rank_of_a_launch_returns_the_runs_summary(tmp_path):
    # Rank 1 returned {"stopped": True, "saved": ""} for a finished run: kiln.train looked for
    # summary.json in its out, which rank 0 alone writes (and a shared out may hold an earlier run's).
    # Each rank has its own out here, as on two machines.
    script = tmp_path / "ranks.py"
    script.write_text("import json, os, sys, kiln\n"
                      "out = os.path.join(sys.argv[1], 'rank' + os.environ['RANK'])\n"
                      "r = kiln.train('resnet20', out=out, **json.loads(sys.argv[2]))\n"
                      "print('RESULT', os.environ['RANK'], json.dumps(r), flush=True)\n")
    opts = dict(RESNET, threads=1, dist_timeout=120)
    r = cli("launch", "--nproc-per-node", 2, "--master-port", free_port(), "--", sys.executable, script, tmp_path,
            json.dumps(opts))
    got = {}
    for line in r.stdout.splitlines():
        if "RESULT " in line:
            rank, summary = line.split("RESULT ", 1)[1].split(" ", 1)
            got[rank] = json.loads(summary)
    assert set(got) == {"0", "1"}, r.stdout + r.stderr
    with open(tmp_path / "rank0" / "summary.json") as f:
        written = json.load(f)
    assert not os.path.exists(tmp_path / "rank1" / "summary.json")
    for rank in ("0", "1"):
        assert "stopped" not in got[rank], (rank, got[rank])
        assert got[rank] == written, rank
    assert written["steps"] == 2 and written["config"]["world_size"] == 2  # 64 samples / (2 ranks x batch 16)


def _signal_rank1_of_two_python_ranks(tmp_path, sig):
    """Two kiln.train ranks under kiln launch; `sig` to rank 1 once it has logged 3 steps. Returns the
    launcher's (returncode, stdout, stderr) and each rank's printed result."""
    script = tmp_path / "ranks.py"
    script.write_text("import json, os, sys, kiln\n"
                      "open(os.path.join(sys.argv[1], 'pid' + os.environ['RANK']), 'w').write(str(os.getpid()))\n"
                      "r = kiln.train('resnet20', out=os.path.join(sys.argv[1], 'run'), **json.loads(sys.argv[2]))\n"
                      "print('RESULT', os.environ['RANK'], json.dumps(r), flush=True)\n")
    opts = dict(batch=16, limit_train=2048, limit_eval=64, max_steps=400, log_every=1, threads=1, workers=0,
                dist_timeout=120)
    p = subprocess.Popen([sys.executable, "-m", "kiln", "launch", "--nproc-per-node", "2", "--master-port",
                          str(free_port()), "--", sys.executable, str(script), str(tmp_path), json.dumps(opts)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, pid1 = tmp_path / "run" / "metrics.jsonl", tmp_path / "pid1"
    deadline = time.time() + 240
    while time.time() < deadline and not (pid1.exists() and metrics.exists()
                                          and metrics.read_text().count('"loss"') >= 3):
        time.sleep(0.05)
    os.kill(int(pid1.read_text()), sig)
    out, err = p.communicate(timeout=240)
    got = {}
    for line in out.splitlines():
        if "RESULT " in line:
            rank, result = line.split("RESULT ", 1)[1].split(" ", 1)
            got[rank] = json.loads(result)
    return p.returncode, out, err, got


def test_a_stop_signal_to_one_rank_raises_there_and_returns_stopped_on_the_others(tmp_path):
    # SIGTERM to rank 1 alone made both ranks raise SystemExit(143), and kiln launch said "failed: rank 0
    # ... exited with status 143"; the CLI's ranks exit 0 after such a stop, so the rank that did not
    # catch the signal returns {"stopped": True} and the launcher reports a stop.
    returncode, out, err, got = _signal_rank1_of_two_python_ranks(tmp_path, signal.SIGTERM)
    assert returncode == 143, out + err
    assert "kiln launch: stopped: rank 1 " in err, out + err
    assert "(it caught SIGTERM, not from the launcher: the ranks stop together)" in err, err
    assert "failed" not in err, err
    assert set(got) == {"0"}, out + err  # rank 1 raised SystemExit(143)
    assert got["0"]["stopped"] is True and got["0"]["saved"].endswith(".kiln"), got
    assert "rank 1 caught SIGTERM at step " in out, out


def test_a_sigint_to_one_python_rank_is_a_stop_under_kiln_launch(tmp_path):
    # kiln.train turns a caught SIGINT into KeyboardInterrupt, and Python ends on an uncaught one by
    # killing itself with SIGINT: kiln launch said "failed: rank 1 ... was killed by signal 2
    # (Interrupt), not sent by the launcher (the rank did not catch it ...)" and stopped rank 0 at once,
    # for the stop both ranks had agreed on.
    returncode, out, err, got = _signal_rank1_of_two_python_ranks(tmp_path, signal.SIGINT)
    assert returncode == 130, out + err
    assert "kiln launch: stopped: rank 1 " in err, out + err
    assert ("was killed by signal 2 (Interrupt) (ended by SIGINT, not from the launcher: a Python rank's "
            "KeyboardInterrupt ends so); the other ranks stopped with it") in err, err
    assert "failed" not in err and "did not catch it" not in err, err
    assert "KeyboardInterrupt: kiln.train: interrupted; saved " in out + err, out + err
    assert set(got) == {"0"}, out + err  # rank 1 raised KeyboardInterrupt
    assert got["0"]["stopped"] is True and got["0"]["saved"].endswith(".kiln"), got
    assert "rank 1 caught SIGINT at step " in out, out
