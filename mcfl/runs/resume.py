"""Resuming a run from its folder: the settings it was started with, and its checkpoint.

Every stop can be resumed (`resume_settings`): before the run's first checkpoint it starts
again from round 1, after its last round's checkpoint only its final files are written (see
`mcfl.runs.runner.run`); a folder whose run completed, or that holds no run, is refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

from mcfl.config import RunConfig
from mcfl.errors import ConfigError, McflError
from mcfl.files import atomic, checkpoint, kinds
from mcfl.files.run_folder import SETTINGS_FILE, read_settings, recover_replacement, run_status
from mcfl.models.build import model_label
from mcfl.runs.records import MemberRecord


def resume_settings(run_dir: Path) -> dict[str, Any]:
    """The settings (config, checkpoint interval) of the run stopped in `run_dir`, from its
    run.json (or, for a folder written before there was one, its checkpoint); an error naming
    the folder if that run completed or there is no run to resume. A stop at any point can be
    resumed: before the first checkpoint the run starts again from round 1, after its last
    round's checkpoint only its final files are written."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise McflError(f"--resume {str(run_dir)!r}: no such folder (it takes a run's folder)")
    kinds.check_kind(run_dir, "run", resuming=True)  # (a sweep or a table: what resumes it)
    recover_replacement(run_dir)
    atomic.remove_temporaries(run_dir)  # what a kill left of a file being written
    settings = read_settings(run_dir)
    if settings is None and checkpoint.exists(run_dir):
        settings = {"config": checkpoint.latest(run_dir).config, "checkpoint_every": None}
    if settings is None and kinds.folder_kind(run_dir) is None:
        raise McflError(f"{str(run_dir)!r} holds no run to resume (no {SETTINGS_FILE}, "
                        "checkpoint or rounds)")
    if settings is None:  # a run killed before it wrote its settings (or from before them)
        raise McflError(f"{str(run_dir)!r} holds a run that cannot be resumed ({SETTINGS_FILE} "
                        f"and a checkpoint are missing); start it again with --out "
                        f"{str(run_dir)} --overwrite")
    if run_status(run_dir) == "completed":
        raise McflError(f"the run in {str(run_dir)!r} already finished all "
                        f"{settings['config'].get('rounds')} rounds; there is nothing to "
                        "resume")
    return settings


def resumed_config(config: Optional[RunConfig], saved: RunConfig, run_dir: Path, out_dir,
                   model=None) -> tuple[RunConfig, Path]:
    """The config `saved` with the run in `run_dir` (checked against `config` if one is
    given, its model recorded by the label of `model`, a user's object, if one is given) and
    the folder a resumed run writes to: its own."""
    if config is not None and model is not None:
        config = config.replace(model=model_label(model))
    if out_dir is not None and Path(out_dir).resolve() != run_dir.resolve():
        raise ConfigError(f"a resumed run writes to its own folder {str(run_dir)!r}, not "
                          f"{str(out_dir)!r}")
    if config is not None and config.to_dict() != saved.to_dict():
        raise ConfigError(f"the config differs from the one checkpointed in {str(run_dir)!r}: "
                          + differences(config, saved, "checkpoint")
                          + "; a run resumes with its own config")
    return saved, run_dir


def differences(config: RunConfig, saved: RunConfig, source: str) -> str:
    """The settings where `config` differs from `saved` (read from `source`), one phrase."""
    mine, theirs = config.to_dict(), saved.to_dict()
    return ", ".join(f"{k}={mine.get(k)!r} ({source}: {theirs.get(k)!r})"
                     for k in dict.fromkeys([*mine, *theirs]) if mine.get(k) != theirs.get(k))



def restore(run_dir: Path, state, rounds_key, record: MemberRecord) -> tuple[Any, int]:
    """Load `run_dir`'s checkpoint into the run's state and `record`; returns the state and
    the last round it finished."""
    saved = checkpoint.restore(run_dir, state, rounds_key)
    record.rows.extend(saved.progress["rows"])
    record.round_seconds.extend(saved.progress["round_seconds"])
    record.assignment_rounds.extend(saved.progress["assignment_rounds"])
    if saved.assignments is not None:
        record.assignments.extend(np.asarray(saved.assignments))
    record.comm_total = record.rows[-1]["comm_params_total"] if record.rows else 0
    return saved.state, saved.round
