"""The results file: one JSON record per finished job (JSONL), appended at once and locked against a second
run, a rerun's record of a job superseding the earlier one; and its records as flat tables."""

from __future__ import annotations

import csv
import fcntl
import json
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Iterable

from zbsolve.app.grid.jobs import Job, PlanJob
from zbsolve.base.errors import InputError
from zbsolve.base.files import write_with
from zbsolve.present.tables import fmt

if TYPE_CHECKING:
    import pandas as pd


def read_results(path: str | Path) -> list[dict]:
    """The latest record of each job in a results file, in the order the jobs first appear (a rerun's record
    supersedes an earlier one); a truncated last line (from a crash) is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    records: dict[str, dict] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise InputError(f"{path} line {i + 1} is not JSON: not a zbsolve results file") from None
        if not isinstance(record, dict) or "hash" not in record or "config" not in record:
            raise InputError(f"{path} line {i + 1} has no 'hash' and 'config': not a zbsolve results file")
        records[record["hash"]] = record
    return list(records.values())


def failed(record: dict) -> bool:
    """Whether a record is a failed job's."""
    return record.get("status") == "error"


def skipped(records: Iterable[dict], retry_failed: bool = False) -> set[str]:
    """The jobs a run skips: every recorded one, or with ``retry_failed`` those whose record is no failure."""
    return {r["hash"] for r in records if not (retry_failed and failed(r))}


class ResultsFile:
    """A results file held open for appending, locked against a second grid run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._file: IO[str] = open(self.path, "a+")
        except OSError as exc:
            raise InputError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            raise InputError(f"{self.path} is in use by another grid run; wait for it or use another -o") from None
        self.records = read_results(self.path)
        """The latest record of each job already in the file."""
        self._drop_truncated_tail()

    def _drop_truncated_tail(self) -> None:
        self._file.seek(0)
        text = self._file.read()
        if text and not text.endswith("\n"):
            self._file.truncate(text.rfind("\n") + 1)

    def append(self, record: dict) -> None:
        """Write one record and flush it to disk at once."""
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Release the lock."""
        self._file.close()


def pending(jobs: Iterable[Job | PlanJob], output: str | Path | None, retry_failed: bool = False) -> tuple[int, int]:
    """(distinct jobs, of those a run skips: already in ``output``, failures not counted with ``retry_failed``)."""
    keys = {j.key for j in jobs}
    return len(keys), len(keys & skipped(read_results(output) if output is not None else [], retry_failed))


WHOLE = ("partition",)
"""List figures written whole, comma-separated as ``--partition`` takes them (a plan's layers per stage); a list of
texts (the layers per stage or device, by the model's names) is written whole as tables show it; any other list is
one value per device, written as its largest."""


def flatten(record: dict) -> dict:
    """One flat row of a record: config and figures side by side (a partition as "5,4,4,6", layer labels as
    ``render.fmt`` writes them, a per-device figure such as peak memory as its maximum)."""
    row = {"hash": record["hash"], **record["config"], "status": record.get("status"),
           "mem_limit_value": record.get("mem_limit"), "solve_time": record.get("solve_time"),
           "error": record.get("error", ""), "schedule": record.get("schedule")}
    for key, value in (record.get("figures") or {}).items():
        if isinstance(value, list) and value and key in WHOLE:
            value = ",".join(map(str, value))
        elif isinstance(value, list) and value:
            value = fmt(value) if isinstance(value[0], str) else max(value)
        row[key] = value
    return row


def write_summary(records: list[dict], path: str | Path) -> None:
    """Write the records as a flat CSV table, whole or not at all."""
    rows = [flatten(r) for r in records]
    columns = list(dict.fromkeys(k for row in rows for k in row))

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)

    write_with(path, write)


def to_dataframe(records: Iterable[dict] | str | Path) -> pd.DataFrame:
    """The records (or a results file) as a pandas DataFrame, one flat row each."""
    import pandas as pd

    if isinstance(records, (str, Path)):
        records = read_results(records)
    return pd.DataFrame([flatten(r) for r in records])
