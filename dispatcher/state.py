"""The dispatcher's state on disk, reloaded when it starts: one YAML file per applied trace with its
generation, written atomically (write a temporary file, fsync, rename); the generation counter; the floor of
the signed commands' sequences; the audit trail (the last AUDIT_LIMIT entries)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml
from google.protobuf import json_format

from hoptrace.spec import SpecError, spec_from_data, spec_to_data
from hoptrace.v1 import api_pb2, trace_pb2

log = logging.getLogger(__name__)

# How far the persisted sequence floor runs ahead of the sequences handed out.
SEQUENCE_FLOOR_AHEAD_NS = 60 * 1_000_000_000
# The audit entries kept (ListAudit, `hoptrace audit`); older ones are dropped.
AUDIT_LIMIT = 10_000


@dataclass
class StoredTrace:
    """A trace as applied: its spec, the generation agents run, when it was applied, and its ID origin
    (the top bits of its packets' IDs, 1..TRACE_ORIGINS; 0: none given yet)."""

    spec: trace_pb2.TraceSpec
    generation: int
    applied_at: datetime
    origin: int = 0


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(partial, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class AuditLog:
    """The last `limit` audit entries: in memory, and one JSON object per line in `path`, appended and fsynced
    as each is recorded (an apply or a delete is seconds of work; the write is not what it waits for). The
    file is rewritten to the last `limit` once it holds twice as many."""

    def __init__(self, path: Path, limit: int = AUDIT_LIMIT) -> None:
        self.path = path
        self.limit = limit
        self._lock = threading.Lock()
        self._entries: deque[api_pb2.AuditEntry] = deque(maxlen=limit)
        self._lines = 0
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        skipped = 0
        for line in lines:
            try:
                self._entries.append(json_format.ParseDict(json.loads(line), api_pb2.AuditEntry()))
            except (ValueError, json_format.ParseError):
                skipped += 1
        if skipped:
            log.error("audit trail %s: %d unreadable line(s) skipped", path, skipped)
        self._lines = len(lines)

    def record(self, entry: api_pb2.AuditEntry) -> None:
        """Keep `entry` (and write it through to the file)."""
        line = json.dumps(json_format.MessageToDict(entry, preserving_proto_field_name=True), sort_keys=True)
        with self._lock:
            self._entries.append(entry)
            try:
                if self._lines >= 2 * self.limit:
                    text = "".join(
                        json.dumps(
                            json_format.MessageToDict(kept, preserving_proto_field_name=True), sort_keys=True
                        )
                        + "\n"
                        for kept in self._entries
                    )
                    _write_atomically(self.path, text)
                    self._lines = len(self._entries)
                    return
                with open(self.path, "a") as handle:
                    handle.write(line + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                self._lines += 1
            except OSError as error:  # the action happened: keep it in memory, say that the file missed it
                log.error("audit trail %s: not written: %s", self.path, error)

    def entries(self, limit: int = 0, trace: str = "") -> list[api_pb2.AuditEntry]:
        """The newest `limit` entries (0: all kept), of trace `trace` only when given; oldest first."""
        with self._lock:
            found = [entry for entry in self._entries if not trace or entry.trace == trace]
        return found[-limit:] if limit else found


class StateStore:
    """The dispatcher's state directory: traces/<name>.yaml, the generation counter, the commands' sequence
    floor and the audit trail (audit.jsonl)."""

    def __init__(self, state_dir: str | Path) -> None:
        self.state_dir = Path(state_dir)
        self.traces_dir = self.state_dir / "traces"
        self.traces_dir.mkdir(parents=True, exist_ok=True)
        self._generation_path = self.state_dir / "generation"
        self._lock = threading.Lock()
        self._last_generation: int | None = None
        # Command sequences (nanoseconds since the epoch, each above the last): a floor kept on disk, a
        # minute ahead of the last handed out, so a restart (even with the clock set back) continues above.
        self._sequence_path = self.state_dir / "sequence"
        self._last_sequence: int | None = None
        self._sequence_floor = 0
        self.clock_ns = time.time_ns  # the wall clock sequences follow (tests set it back)
        self.audit = AuditLog(self.state_dir / "audit.jsonl")

    def path_for(self, name: str) -> Path:
        """The file of trace `name` (names are [a-z0-9-]+, safe as file names)."""
        return self.traces_dir / f"{name}.yaml"

    def save(self, stored: StoredTrace) -> None:
        """Write one trace (replacing its previous generation) atomically."""
        document = {
            "generation": stored.generation,
            "origin": stored.origin,
            "applied_at": stored.applied_at.isoformat(),
            "spec": spec_to_data(stored.spec),
        }
        # What apply resolved container:/pod: hops to (the spec's YAML form keeps what the user wrote): a
        # restarted dispatcher pushes the same plans.
        workloads = [
            json_format.MessageToDict(hop.workload, preserving_proto_field_name=True)
            if hop.HasField("workload")
            else None
            for hop in stored.spec.hops
        ]
        if any(workloads):
            document["workloads"] = workloads
        text = "# hoptrace dispatcher state: the applied spec of one trace\n" + yaml.safe_dump(
            document, sort_keys=False
        )
        with self._lock:
            _write_atomically(self.path_for(stored.spec.name), text)

    def delete(self, name: str) -> None:
        """Forget trace `name` (no error if it is not stored)."""
        with self._lock:
            self.path_for(name).unlink(missing_ok=True)

    def load(self) -> list[StoredTrace]:
        """Every stored trace; unreadable files are logged and skipped: one bad file does not stop startup.
        The controller checks each spec before it compiles one."""
        traces = []
        for path in sorted(self.traces_dir.glob("*.yaml")):
            try:
                document = yaml.safe_load(path.read_text())
                spec = spec_from_data(document["spec"])
                for hop, workload in zip(spec.hops, document.get("workloads") or [], strict=False):
                    if workload:
                        json_format.ParseDict(workload, hop.workload)
                stored = StoredTrace(
                    spec=spec,
                    generation=int(document["generation"]),
                    applied_at=datetime.fromisoformat(document["applied_at"]),
                    origin=int(document.get("origin") or 0),
                )
            except (
                OSError,
                yaml.YAMLError,
                KeyError,
                TypeError,
                ValueError,
                SpecError,
                json_format.ParseError,
            ) as error:
                log.error("skipping unreadable state file %s: %s", path, error)
                continue
            traces.append(stored)
        return traces

    def next_generation(self) -> int:
        """A new generation number, larger than any handed out before (persisted across restarts).

        One counter for all traces: a trace deleted and applied again can never reuse a generation an agent
        may still run.
        """
        with self._lock:
            self._last_generation = self._generation_read() + 1
            _write_atomically(self._generation_path, f"{self._last_generation}\n")
            return self._last_generation

    def current_generation(self) -> int:
        """The newest generation handed out (0 before the first): a removal carries it, so an agent takes
        it after every apply it may have seen, and refuses it after a later one."""
        with self._lock:
            return self._generation_read()

    def _generation_read(self) -> int:
        """The newest generation handed out (the caller holds the lock)."""
        if self._last_generation is None:
            try:
                counter = int(self._generation_path.read_text().strip() or 0)
            except (FileNotFoundError, ValueError):
                counter = 0
            self._last_generation = max([counter, *(stored.generation for stored in self.load())])
        return self._last_generation

    def next_sequence(self) -> int:
        """The sequence of the next signed command: the wall clock in nanoseconds, above every one handed out
        before, across restarts (docs/security.md, "Signed commands"). The floor on disk is written once a
        minute of sequences, not per command."""
        with self._lock:
            if self._last_sequence is None:
                try:
                    self._sequence_floor = int(self._sequence_path.read_text().strip() or 0)
                except (FileNotFoundError, ValueError):
                    self._sequence_floor = 0
                self._last_sequence = self._sequence_floor
            sequence = max(self.clock_ns(), self._last_sequence + 1)
            if sequence >= self._sequence_floor:
                self._sequence_floor = sequence + SEQUENCE_FLOOR_AHEAD_NS
                _write_atomically(self._sequence_path, f"{self._sequence_floor}\n")
            self._last_sequence = sequence
            return sequence


def now() -> datetime:
    """The current time, timezone-aware (UTC)."""
    return datetime.now(UTC)
