"""Experiment trackers (`train.tracker`): a training run sends its config, group, name and every metrics row to
Weights & Biases (offline mode, read back from the run file) and trackio (its local database, read with
sqlite3); an unknown tracker is refused before any compute."""
import glob
import json
import os
import sqlite3
import struct
import subprocess
import sys
import time

import pytest

from zarya_jax.config import ConfigError
from zarya_jax.train import config as rc
from zarya_jax.train.loop import train
from zarya_jax.train.metrics import read_metrics


def wandb_records(run_file: str) -> list:
    """The protobuf records of a W&B run file (LevelDB log format: 32 KiB blocks of CRC'd chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(run_file, "rb").read()
    assert data[:4] == b":W&B"
    records, chunk, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # still being written
            break
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a record is complete
            record = pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("trk") / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    return str(path)


def run_config(data_file: str, **train) -> rc.RunConfig:
    sets = {"data.train": data_file, "data.max_length": 16, "data.batch_size": 2, "data.eval_fraction": 0,
            "mesh.num_devices": 1, "model.num_layers": 1, "train.objective": "ar", "train.steps": 2,
            "train.log_every": 1, "train.eval_every": 0, "train.save_every": 0, "train.export_final": False,
            "train.progress_bar": False, "train.async_checkpointing": False}
    return rc.load("tiny", {**sets, **{f"train.{k}": v for k, v in train.items()}})


def test_wandb_offline_gets_config_group_and_every_row(data_file, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = run_config(data_file, tracker="wandb", tracker_group="sweep-a")
    workdir = tmp_path / "lr-small"
    train(run, str(workdir))
    rows = read_metrics(str(workdir))
    (run_file,) = glob.glob(str(workdir / "wandb" / "offline-run-*" / "run-*.wandb"))
    deadline = time.time() + 60  # wandb's service may still be flushing the file after finish() returns
    records = wandb_records(run_file)
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.time() < deadline, "the W&B run file never got its exit record"
        time.sleep(0.2)
        records = wandb_records(run_file)
    (info,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (info.run_group, info.display_name, info.project) == ("sweep-a", "lr-small", "zarya")
    config = {u.key: json.loads(u.value_json) for u in info.config.update}
    assert config["optim"] == run.to_dict()["optim"] and config["train"]["tracker"] == "wandb"
    history = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            history.append((r.history.step.num, items["loss"], items["grad_norm"]))
    assert history == [(row["step"], pytest.approx(row["loss"]), pytest.approx(row["grad_norm"])) for row in rows]
    assert [h[0] for h in history] == [1, 2]


def test_trackio_local_database_gets_config_group_and_every_row(tmp_path):
    # trackio fixes its storage directory (TRACKIO_DIR) when imported, so it runs in a process of its own.
    code = ("import json, sys; from functools import partial; from zarya_jax.train import trackers; "
            "from zarya_jax.train.metrics import MetricsLog; "
            "log = MetricsLog(sys.argv[1], 0, tensorboard=False, tracker=partial(trackers.open_tracker, 'trackio', "
            "project='proj', group='sweep-b', name='run-1', config={'optim': {'lr': 0.001}}, workdir=sys.argv[1])); "
            "[log.write(s, {'loss': 1.0 / s, 'lr': 0.001}) for s in (1, 2, 3)]; log.close()")
    env = dict(os.environ, TRACKIO_DIR=str(tmp_path / "trackio"), HF_HUB_OFFLINE="1")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, capture_output=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    db = sqlite3.connect(tmp_path / "trackio" / "proj.db")
    (run_name, config), = db.execute("select run_name, config from configs").fetchall()
    config = json.loads(config)
    assert run_name == "run-1" and config["_Group"] == "sweep-b" and config["optim"] == {"lr": 0.001}
    logged = [(step, json.loads(m)) for step, m in db.execute("select step, metrics from metrics order by step")]
    assert logged == [(s, {"loss": 1.0 / s, "lr": 0.001}) for s in (1, 2, 3)]
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"step": s, **m} for s, m in logged]


def test_unknown_or_missing_tracker_is_refused_before_compute(data_file, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"train.tracker='tensorboard': expected one of \('none', 'wandb', 'trackio'\)"):
        run_config(data_file, tracker="tensorboard")
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"train.tracker=wandb needs the wandb package: pip install -e \"\.\[wandb\]\""):
        train(run_config(data_file, tracker="wandb"), str(tmp_path / "w"))
    assert not (tmp_path / "w" / "metrics.jsonl").exists()
