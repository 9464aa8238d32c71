"""A submitted run's job record, runs/<run-id>/job.json: what podrun submit submitted, where, and as which job (podrun
submit writes it; podrun cancel, podrun status and the launch's account read it)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from podrun.errors import HostError

JOB_FILE = "job.json"
RECORD_LIMIT = 1 << 20       # bytes of job.json read at most


@dataclass(frozen=True)
class JobRecord:
    """runs/<run-id>/job.json: what was submitted, where, and as which job."""

    run_id: str
    run_dir: str
    scheduler: str
    job_id: str
    script: str
    submit_argv: tuple[str, ...]
    submitted_at: float
    cluster: str | None = None
    nodes: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**asdict(self), "submit_argv": list(self.submit_argv)}

    def save(self) -> Path:
        from podrun.safefs import write_file

        return write_file(Path(self.run_dir) / JOB_FILE, json.dumps(self.to_dict(), indent=2) + "\n", "job record")

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> "JobRecord":
        """job.json, read only when this user (or root) alone can have written it (it names the job to cancel)."""
        from podrun.safefs import read_trusted

        p = Path(run_dir) / JOB_FILE
        try:
            d = json.loads(read_trusted(p, "job record", limit=RECORD_LIMIT, error=HostError))
            d["submit_argv"] = tuple(d.get("submit_argv", ()))
            return cls(**d)
        except FileNotFoundError:
            raise HostError(f"{p} does not exist: '{run_dir}' is not a submitted run",
                            hint="pass a run directory written by podrun submit, or a job id") from None
        except (OSError, ValueError, TypeError) as exc:
            raise HostError(f"{p} is not a job record podrun can read: {exc}") from None
