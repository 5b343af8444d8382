"""Read back an offline W&B run (``offline-run-*/run-<id>.wandb``) without a network.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic, version), then
32 KiB blocks of LevelDB-log records (crc32, length, type; FULL or FIRST/MIDDLE/LAST
fragments), each record a ``wandb_internal.Record`` protobuf.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes):
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # block trailer: padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        body = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            yield pending + body
            pending = b""


def read_run(run_dir: str | Path, timeout: float = 60.0) -> dict:
    """``{id, job_type, group, name, config, history: [rows], summary, stats: n}`` of a run folder.

    W&B's service process writes the log after the run object is finished; this waits
    (up to ``timeout`` seconds) for the log's ``exit`` record.
    """
    deadline = time.monotonic() + timeout
    while True:
        out = _read(run_dir)
        if out.get("exited") and "id" in out or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def _read(run_dir: str | Path) -> dict:
    from wandb.proto import wandb_internal_pb2 as pb

    run_dir = Path(run_dir)
    (log,) = run_dir.glob("run-*.wandb")
    out: dict = {"config": {}, "history": [], "summary": {}, "stats": 0, "output": 0}
    for payload in _payloads(log.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out.update(id=run.run_id, job_type=run.job_type, group=run.run_group,
                       name=run.display_name)  # fmt: skip
            out["config"].update({i.key: json.loads(i.value_json) for i in run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            out["history"].append(row)
        elif kind == "summary":
            for item in record.summary.update:
                out["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "stats":
            out["stats"] += 1
        elif kind in ("output", "output_raw"):
            out["output"] += 1
        elif kind == "exit":
            out["exited"] = True
    return out


def offline_runs(folder: str | Path) -> list[Path]:
    """The offline W&B run folders under ``folder`` (recursively), oldest first."""
    return sorted(Path(folder).rglob("offline-run-*"), key=lambda p: p.name)
