"""Faults a long run meets, through `python -m experiments.train` in-process on a real tiny run: damaged
run checkpoints, reruns of a finished run, a moved or respelled workdir, changed data, a forced resume
that cannot fit, and divergence (exit 3, nothing saved from the diverged state). Plus the checksum
itself: NumPy and on-device (sharded) sums agree, and the detector's thresholds on synthetic curves.
And what a run meets from outside: another run on its workdir (the lock, with real processes), a
signal (exit 128 + its number, nothing half-written), the umask, a byte-order mark, links."""
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import cli, generate
from experiments import train as train_cli
from zarya_jax import checkpoint, lock
from zarya_jax.data.tokenizer import ByteTokenizer
from zarya_jax.experiment import TrainingInterrupted
from zarya_jax.eval import tasks
from zarya_jax.files import OutputPathError, atomic_directory, atomic_write_json, check_output
from zarya_jax.nn import integrity
from zarya_jax.train.divergence import DivergenceConfig, DivergenceDetector
from zarya_jax.testing import write_sum_records

from test_bad_inputs import flip_bytes, largest_file, snapshot

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BASE = ["--config", "tiny", "--set", "model.num_layers=1", "--set", "data.max_length=24", "--set", "data.batch_size=4",
        "--set", "data.eval_fraction=0", "--set", "mesh.num_devices=1", "--set", "optim.warmup_steps=1",
        "--set", "train.steps=4", "--set", "train.save_every=2", "--set", "train.keep=2", "--set", "train.log_every=1",
        "--set", "train.eval_every=0", "--set", "train.async_checkpointing=false", "--set", "train.progress_bar=false",
        "--set", "zarya.slot_size_set=[2]", "--set", "zarya.slot_step_borders=[1.0]"]


def argv(workdir, data, *more):
    return BASE + ["--workdir", str(workdir), "--set", f"data.train={data}", *more]


def run(capsys, args):
    code = train_cli.main([str(a) for a in args])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out


def write_data(path):
    write_sum_records(path, 16)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run whose data lives inside its workdir (as the quickstart's does)."""
    workdir = tmp_path_factory.mktemp("faults") / "run"
    workdir.mkdir()
    write_data(workdir / "train.jsonl")
    code = train_cli.main(argv(workdir, workdir / "train.jsonl"))
    assert code == 0
    return workdir


def copy_run(finished, dest):
    shutil.copytree(finished, dest)
    return dest


def test_checksums_agree_on_host_and_device():
    """The NumPy sums (host arrays) and the jitted sums (device arrays, here sharded over 8 devices) are
    the same numbers, for every item size; a flipped bit changes them."""
    rng = np.random.default_rng(0)
    arrays = {"f32": rng.standard_normal((16, 24)).astype(np.float32),
              "bf16": rng.standard_normal((8, 5)).astype(jnp.bfloat16), "i8": rng.integers(-9, 9, 7).astype(np.int8),
              "bool": rng.integers(0, 2, (4, 4)).astype(bool), "scalar": np.int32(7)}
    host = integrity.array_checksums(arrays)
    mesh = jax.make_mesh((8,), ("x",))
    spec = (lambda v: jax.sharding.PartitionSpec("x") if np.ndim(v) and np.shape(v)[0] % 8 == 0
            else jax.sharding.PartitionSpec())
    sharded = {k: jax.device_put(v, jax.sharding.NamedSharding(mesh, spec(v))) for k, v in arrays.items()}
    device = jax.device_get(integrity._device_tree_sums(sharded))
    assert {k: integrity._format(v) for k, v in device.items()} == {k: host[f"['{k}']"]["sum"] for k in arrays}
    flipped = arrays["f32"].copy()
    flipped.reshape(-1).view(np.uint32)[37] ^= np.uint32(1 << 31)
    assert integrity.array_checksums({"f32": flipped})["['f32']"] != host["['f32']"]


def test_rerun_of_finished_run_keeps_its_numbers(finished, capsys):
    recorded = json.load(open(finished / "summary.json"))
    assert recorded["loss"] is not None and recorded["tokens_per_s"] is not None
    before = snapshot(str(finished / "final")) | {"metrics": os.stat(finished / "metrics.jsonl").st_mtime_ns}
    code, out = run(capsys, argv(finished, finished / "train.jsonl"))
    summary = json.loads(out.out[out.out.index("{\n"):])
    assert code == 0 and summary["start_step"] == summary["step"] == 4
    assert summary["loss"] == recorded["loss"] and summary["tokens_per_s"] == recorded["tokens_per_s"]
    assert json.load(open(finished / "summary.json")) == recorded   # not overwritten with nulls
    assert snapshot(str(finished / "final")) | {"metrics": os.stat(finished / "metrics.jsonl").st_mtime_ns} == before


def test_damaged_run_checkpoint_is_one_clean_error(finished, tmp_path, capsys):
    for damage in ("flip", "truncate"):
        workdir = copy_run(finished, tmp_path / damage)
        state = largest_file(str(workdir / "checkpoints" / "4" / "state"))
        flip_bytes(state) if damage == "flip" else os.truncate(state, os.path.getsize(state) // 2)
        before = snapshot(str(workdir))
        code, out = run(capsys, argv(workdir, workdir / "train.jsonl"))
        errors = [line for line in out.err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and f"{workdir}/checkpoints/4" in errors[0], out.err
        assert "is damaged" in errors[0]
        assert snapshot(str(workdir)) == before


def test_moved_or_respelled_workdir_resumes_changed_data_does_not(finished, tmp_path, capsys, monkeypatch):
    moved = copy_run(finished, tmp_path / "elsewhere" / "moved")
    code, out = run(capsys, argv(moved, moved / "train.jsonl"))
    assert code == 0, out.err
    monkeypatch.chdir(tmp_path)                                  # the same run, spelled relative
    code, out = run(capsys, argv("./elsewhere/moved", "elsewhere/../elsewhere/moved/train.jsonl"))
    assert code == 0, out.err
    with open(moved / "train.jsonl", "a") as f:                  # same path, new content: another run
        f.write(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    before = snapshot(str(moved))
    code, out = run(capsys, argv(moved, moved / "train.jsonl"))
    assert code == 2 and "data.train: the content differs" in out.err and "--force" in out.err
    assert snapshot(str(moved)) == before


def test_failed_forced_restore_changes_nothing(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path / "forced")
    before = {name: open(workdir / name, "rb").read() for name in ("run_config.json", "fingerprint.json")}
    snap = snapshot(str(workdir))
    code, out = run(capsys, argv(workdir, workdir / "train.jsonl", "--set", "model.hidden_size=32"))
    assert code == 2 and "different config" in out.err and "model.hidden_size" in out.err and "--force" in out.err
    code, out = run(capsys, argv(workdir, workdir / "train.jsonl", "--set", "model.hidden_size=32", "--force"))
    errors = [line for line in out.err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "does not fit this run's config" in errors[0], out.err
    assert snapshot(str(workdir)) == snap
    assert {name: open(workdir / name, "rb").read() for name in before} == before
    code, out = run(capsys, argv(workdir, workdir / "train.jsonl"))   # the original still resumes
    assert code == 0, out.err


@pytest.mark.parametrize("lr", ["1e6", "1e30"])
def test_divergence_stops_before_its_state_is_saved(tmp_path, capsys, lr):
    """lr=1e6 blows the weights up with finite numbers, lr=1e30 makes them non-finite. The warmup's first
    step has lr 0, so step 1 is healthy and checkpointed; step 2 diverges: exit 3, and no checkpoint or
    export of it (the message names the healthy checkpoint)."""
    write_data(tmp_path / "train.jsonl")
    workdir = tmp_path / "run"
    code, out = run(capsys, argv(workdir, tmp_path / "train.jsonl", "--set", f"optim.lr={lr}",
                                 "--set", "train.save_every=1"))
    errors = [line for line in out.err.splitlines() if line.startswith("error:")]
    assert code == 3 and len(errors) == 1, out.err
    assert "at step 2" in errors[0] and f"{workdir}/checkpoints/1, was written from a healthy state" in errors[0]
    assert ("params' norm grew" if lr == "1e6" else "non-finite") in errors[0]
    assert [n for n in os.listdir(workdir / "checkpoints") if n.isdigit()] == ["1"]
    assert not os.path.exists(workdir / "final")


def test_detector_thresholds():
    healthy = DivergenceDetector(DivergenceConfig(), param_norm0=10.0)
    rng = np.random.default_rng(0)
    # a falling loss with noise, a curriculum bump and slowly growing weights: never trips
    for step in range(1, 2001):
        loss = 5.0 * np.exp(-step / 150) + 0.02 + 0.3 * (800 <= step < 820) + abs(rng.normal(0, 0.02))
        metrics = {"loss": loss, "grad_norm": 1.0 + rng.random(), "param_norm": 10.0 + step / 200}
        assert healthy.check(step, metrics) is None, step
    spike = DivergenceDetector(DivergenceConfig())
    for step in range(1, 21):
        assert spike.check(step, {"loss": 1.0, "grad_norm": 1.0}) is None
    assert "far above its running median" in spike.check(21, {"loss": 11.0, "grad_norm": 1.0})
    # a new curriculum stage (the drafter's block size) restarts the history; a spike within it still trips
    staged = DivergenceDetector(DivergenceConfig())
    for step in range(1, 21):
        assert staged.check(step, {"loss": 0.1, "grad_norm": 1.0, "block_size": 2.0}) is None
    assert staged.check(21, {"loss": 3.4, "grad_norm": 1.0, "block_size": 4.0}) is None
    for step in range(22, 42):
        assert staged.check(step, {"loss": 0.5, "grad_norm": 1.0, "block_size": 4.0}) is None
    assert "far above its running median" in staged.check(42, {"loss": 9.0, "grad_norm": 1.0, "block_size": 4.0})
    dead = DivergenceDetector(DivergenceConfig(zero_grad_steps=3))
    assert [dead.check(s, {"loss": 1.0, "grad_norm": 0.0}) is None for s in (1, 2, 3)] == [True, True, False]
    off = DivergenceDetector(DivergenceConfig(zero_grad_steps=0, loss_spike_factor=0, param_growth=0), 1.0)
    assert all(off.check(s, {"loss": 1e9 * s, "grad_norm": 0.0, "param_norm": 1e9}) is None for s in range(1, 30))


# ---- one run per workdir: the lock, with real processes

HOLD = """import sys, time
from zarya_jax.lock import workdir_lock
with workdir_lock(sys.argv[1], "holder"):
    print("held", flush=True)
    time.sleep(120)
"""


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))


def test_a_live_lock_refuses_a_second_run_and_a_dead_one_is_broken(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path / "locked")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], stdout=subprocess.PIPE, text=True,
                              env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(str(workdir))
        code, out = run(capsys, argv(workdir, workdir / "train.jsonl"))
        errors = [line for line in out.err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1, out.err
        assert "is in use by another run" in errors[0] and f"pid {holder.pid} " in errors[0] and "holder" in errors[0]
        assert snapshot(str(workdir)) == before
    finally:
        holder.kill()  # SIGKILL: no release, the lock file stays behind with a dead pid
        holder.wait()
    assert json.load(open(workdir / lock.LOCK_NAME))["pid"] == holder.pid
    code, out = run(capsys, argv(workdir, workdir / "train.jsonl"))
    assert code == 0, out.err
    assert not os.path.exists(workdir / lock.LOCK_NAME)   # broken, then taken and released


def test_a_lock_of_another_host_is_never_broken(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / lock.LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "another-host", "started": "then"}))
    with pytest.raises(lock.WorkdirLocked, match="pid 1 on host 'another-host'"):
        with lock.workdir_lock(workdir):
            pass
    assert os.path.exists(workdir / lock.LOCK_NAME)
    fresh = tmp_path / "new" / "deeper"          # a refused or finished run leaves no directory behind
    with lock.workdir_lock(fresh) as path:
        assert json.load(open(path))["pid"] == os.getpid()
        with pytest.raises(lock.WorkdirLocked, match=f"pid {os.getpid()} "):  # one process, one run
            lock.acquire(str(fresh))
    assert not os.path.exists(tmp_path / "new")


def test_racing_runs_on_a_stale_lock_take_it_once(tmp_path):
    """Four processes find the same stale lock at once: exactly one gets the workdir."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (workdir / lock.LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    race = ("import os, sys, time\nfrom zarya_jax import lock\nprint('ready', flush=True)\n"
            "while not os.path.exists(sys.argv[2]):\n    time.sleep(0.001)\n"
            "try:\n    lock.acquire(sys.argv[1]); print('took', flush=True); time.sleep(3)\n"
            "except lock.WorkdirLocked:\n    print('refused')\n")
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", race, str(workdir), str(go)], stdout=subprocess.PIPE,
                              text=True, env=_env()) for _ in range(4)]
    assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 4
    go.touch()  # all at once
    results = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert results == ["refused"] * 3 + ["took"], results


# ---- signals: 128 + the signal's number, nothing half-written

def test_interrupt_statuses_are_128_plus_the_signal(capsys):
    def stopped(exc):
        def body():
            raise exc
        return cli.run(body)
    assert stopped(KeyboardInterrupt()) == 130
    assert stopped(TrainingInterrupted("training stopped by signal 15", signal.SIGTERM)) == 143
    assert stopped(TrainingInterrupted("training stopped by signal 2", signal.SIGINT)) == 130
    assert capsys.readouterr().err.count("interrupted:") == 3


@pytest.fixture(scope="module")
def eval_inputs(tmp_path_factory, tiny_config, tiny_params):
    root = tmp_path_factory.mktemp("signals")
    ckpt = checkpoint.save(root / "ckpt", tiny_params, tiny_config, tokenizer=ByteTokenizer())
    with open(root / "data.jsonl", "w") as f:
        for i in range(400):
            f.write(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n")
    return root, ckpt


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_evaluate_exits_cleanly(eval_inputs, signum):
    """Ctrl-C (or SIGTERM) while `evaluate` decodes: exit 128 + signal (it used to end in a segmentation
    fault, 139, tearing the interpreter down under XLA's threads), and no output, half or whole."""
    root, ckpt = eval_inputs
    out_dir = root / f"out-{signum}"
    proc = subprocess.Popen([sys.executable, "-m", "experiments.evaluate", "--ckpt", ckpt, "--data",
                             str(root / "data.jsonl"), "--modes", "ar,mdm", "--max-new-tokens", "16",
                             "--out", str(out_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=_env(), cwd=REPO)
    seen = b""
    while b"eval ar" not in seen:  # the progress bar: decoding has started
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk, seen.decode(errors="replace")[-2000:]
        seen += chunk
    proc.send_signal(signum)
    rest, _ = proc.communicate(timeout=120)
    text = (seen + rest).decode(errors="replace")
    assert proc.returncode == 128 + signum, text[-2000:]
    assert "interrupted:" in text and "Traceback" not in text
    assert not os.path.exists(out_dir) or os.listdir(out_dir) == []


# ---- files: permissions per the umask, a byte-order mark, paths that resolve onto an input

def test_written_files_follow_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        atomic_write_json(tmp_path / "report.json", {"a": 1})
        with atomic_directory(tmp_path / "folder") as tmp:
            open(os.path.join(tmp, "x"), "w").close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "report.json").st_mode) == 0o664
    assert stat.S_IMODE(os.stat(tmp_path / "folder").st_mode) == 0o775


def test_a_byte_order_mark_is_read(tmp_path):
    text = "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(3))
    (tmp_path / "plain.jsonl").write_text(text)
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert tasks.read_jsonl(str(tmp_path / "bom.jsonl")) == tasks.read_jsonl(str(tmp_path / "plain.jsonl"))
    (tmp_path / "prompts.txt").write_bytes("\ufeffcafé\n2+2=\n".encode())
    args = generate.build_parser().parse_args(["--ckpt", "x", "--prompts-file", str(tmp_path / "prompts.txt")])
    assert generate.read_prompts(args) == ["café", "2+2="]


def test_output_guard_resolves_links(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.symlink(ckpt, tmp_path / "alias")
    with pytest.raises(OutputPathError, match="lies inside the input --ckpt"):
        check_output(tmp_path / "alias" / "out", {"--ckpt": str(ckpt)}, "--out")
    (ckpt / "d.jsonl").write_text("{}\n")
    with pytest.raises(OutputPathError, match="contains the input --data"):
        check_output(tmp_path, {"--data": str(tmp_path / "ckpt" / "d.jsonl"), "--ckpt": None}, "--out", writes=["ckpt"])
    check_output(tmp_path, {"--ckpt": str(ckpt)}, "--out", writes=["summary.json"])   # a sibling is no clash
    check_output(tmp_path / "elsewhere", {"--ckpt": str(ckpt), "--hub": "Qwen/Qwen3-0.6B"}, "--out")
