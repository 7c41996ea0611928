"""Checkpoints of a run in its folder (orbax-checkpoint), and stopping at a round's end.

A checkpoint holds everything the rest of a run depends on: the algorithm's state, the last
round finished, the run's PRNG key data and the rows and cluster assignments recorded so far.
A run is a pure function of (config, seed) whose round r is keyed ``fold_in(rounds_key, r)``,
so a run resumed from round r's checkpoint computes exactly what the uninterrupted run computes
after round r: its rounds.csv and summary.json are the same apart from timings.

Checkpoints are taken only between host calls (after a round, or after a scanned chunk of
rounds), where the state is whole: `StopRequests` turns SIGINT / SIGTERM into a request that
the training loop honours there (a second signal stops at once).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from mcfl.errors import ConfigError, McflError
from mcfl.files import faults
from mcfl.files.atomic import WriteError
from mcfl.runtime.memory import resident_bytes

FOLDER = "checkpoints"
# Default interval when no --checkpoint-every is given: a checkpoint costs a write of the
# state, so it is taken by time (and at every stop), not every round.
DEFAULT_SECONDS = 300.0


class Saved(NamedTuple):
    """What a checkpoint gives back."""

    round: int  # the last round finished
    state: Any
    config: dict[str, Any]  # the run's config by flat key (its to_dict())
    progress: dict[str, Any]  # rows, round_seconds and assignment rounds recorded so far
    assignments: Optional[np.ndarray]  # [E, C] clusters after each evaluated round


def _manager(folder: Path):
    import orbax.checkpoint as ocp

    # cleanup_tmp_directories: a save a kill cut short leaves a temporary folder; drop it.
    options = ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False,
                                           create=True, cleanup_tmp_directories=True)
    handlers = {"arrays": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(folder.absolute(), options=options, item_handlers=handlers)


def check_every(every) -> None:
    """A checkpoint cadence (`--checkpoint-every`, `checkpoint_every=`): None or whole rounds."""
    if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                              or every < 1):
        raise ConfigError(f"--checkpoint-every must be a whole number of rounds >= 1, got "
                          f"{every!r}")


def exists(run_dir: Path) -> bool:
    folder = Path(run_dir) / FOLDER
    return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


class Checkpoints:
    """The checkpoints of the run in `run_dir`: one kept (the latest), every `every` rounds
    (at the first host call's end at or past each multiple), or, `every` None, every
    `DEFAULT_SECONDS` of training; `save` is also called at every stop."""

    def __init__(self, run_dir: Path, every: Optional[int] = None,
                 seconds: float = DEFAULT_SECONDS):
        check_every(every)
        self.folder = Path(run_dir) / FOLDER
        self._every = every
        self._seconds = seconds
        self._manager = None
        self._last_round = 0
        self._last_time = time.monotonic()

    def due(self, round_: int) -> bool:
        if self._every is not None:
            return round_ // self._every > self._last_round // self._every
        return time.monotonic() - self._last_time >= self._seconds

    def save(self, round_: int, state, rounds_key: jax.Array, settings: dict[str, Any],
             progress: dict[str, Any], assignments: list[np.ndarray]) -> None:
        """Write the checkpoint of round `round_` (the previous one is deleted only once this
        one is whole). A write that fails (a full disk, a lost permission) raises `WriteError`
        naming the folder and the cause, and leaves the previous checkpoint as it was.
        `settings`: the run's config by flat key (``RunConfig.to_dict()``)."""
        import orbax.checkpoint as ocp

        arrays = {"state": state, "rounds_key": np.asarray(jax.random.key_data(rounds_key))}
        if assignments:
            arrays["assignments"] = np.stack(assignments)
        meta = {"round": round_, "config": settings, "progress": progress}
        faults.point("checkpoint")
        _check_writable(self.folder)
        _check_space(self.folder, arrays, meta)
        try:
            with _quiet_orbax(), _stderr_muted():
                if self._manager is None:
                    self._manager = _manager(self.folder)
                self._manager.save(round_, args=ocp.args.Composite(
                    arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)),
                    force=True)
                self._manager.wait_until_finished()
        except Exception as e:  # orbax wraps the OSError; report its cause in one line
            self._discard_manager()
            _let_writes_in_flight_fail()
            _remove_partial_saves(self.folder)
            raise WriteError(self.folder, _os_cause(e)) from None
        self._last_round = round_
        self._last_time = time.monotonic()

    def resumed_at(self, round_: int) -> None:
        """The run resumed from its checkpoint of `round_`: the next is due a full interval on."""
        self._last_round = round_

    def move_to(self, run_dir: Path) -> None:
        """The run's folder moved to `run_dir` (a replaced run swapped in)."""
        self.close()
        self.folder = Path(run_dir) / FOLDER

    def _discard_manager(self) -> None:
        with contextlib.suppress(Exception), _quiet_orbax():
            self.close()
        self._manager = None

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None


def latest(run_dir: Path) -> Saved:
    """The latest checkpoint in `run_dir` without its arrays (its round, config and records);
    an error naming the folder if there is none."""
    return _read(run_dir)


# What orbax writes besides the arrays and the metadata: about 20 small files, each taking at
# least a block of the file system.
_FILES_OVERHEAD = 256 * 1024


def _check_space(folder: Path, arrays, meta) -> None:
    """Refuse a checkpoint the disk has no room for before orbax starts writing it: a write
    that fails inside orbax leaves its threads reporting the failure at length."""
    try:
        stats = os.statvfs(folder if folder.exists() else folder.parent)
    except OSError:
        return
    free = stats.f_bavail * stats.f_frsize
    need = (resident_bytes(arrays) + len(json.dumps(meta, default=str)) + _FILES_OVERHEAD)
    if free < need:
        raise WriteError(folder, OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (a "
                                         f"checkpoint needs about {need / 2**20:.1f} MiB, "
                                         f"{free / 2**20:.1f} MiB are free)"))


def _os_cause(error: BaseException) -> BaseException:
    """The OSError behind `error`: in its chain (orbax raises its own types around it), or
    named by tensorstore's message (``[os_error_code='28']``); else `error`."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        code = re.search(r"os_error_code='(\d+)'", str(seen))
        if code:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
        seen = seen.__cause__ or seen.__context__
    return error


def _remove_partial_saves(folder: Path) -> None:
    """Delete what a failed save left: orbax's temporary folders (a step folder is renamed
    into place only when whole)."""
    if folder.is_dir():
        for partial in folder.glob("*.orbax-checkpoint-tmp*"):
            shutil.rmtree(partial, ignore_errors=True)


_ORBAX_LOGGERS = ("absl", "orbax", "asyncio")


@contextlib.contextmanager
def _quiet_orbax():
    """orbax logs a failed write at length (absl repeats it, asyncio again when its tasks are
    collected) and tensorstore's callbacks, for writes still in flight, raise "Event loop is
    closed" into `sys.unraisablehook` (from their own threads, at any later moment): the
    one-line `WriteError` says it instead. After a failure the quiet is kept (those reports
    come later); after a success everything is as it was."""
    loggers = [logging.getLogger(name) for name in _ORBAX_LOGGERS]
    levels = [logger.level for logger in loggers]
    hook, unraisable = sys.excepthook, sys.unraisablehook
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    sys.excepthook = _without_closed_loops(hook)
    sys.unraisablehook = _unraisable_without_closed_loops(unraisable)
    yield  # (an exception leaves the quiet on)
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)
    sys.excepthook, sys.unraisablehook = hook, unraisable


@contextlib.contextmanager
def _stderr_muted():
    """The process's stderr (file descriptor 2) goes to /dev/null for the block: tensorstore's
    threads print a traceback there for each write a failure cut short (not through Python's
    hooks, which `_quiet_orbax` covers)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _let_writes_in_flight_fail() -> None:
    """After a failed save, the writes still in flight fail too: let them, with stderr muted,
    rather than as the process ends."""
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited")
    with _stderr_muted():
        time.sleep(0.5)
        gc.collect()


def _without_closed_loops(hook):
    def excepthook(kind, value, traceback):
        if not _closed_loop(kind, value):
            hook(kind, value, traceback)

    return excepthook


def _closed_loop(kind, value) -> bool:
    return kind is RuntimeError and str(value) == "Event loop is closed"


def _unraisable_without_closed_loops(hook):
    def unraisablehook(report):
        if not _closed_loop(report.exc_type, report.exc_value):
            hook(report)

    return unraisablehook


def _check_writable(folder: Path) -> None:
    """Refuse a checkpoint into a folder that cannot be written (read-only file system, lost
    permission) before orbax starts: see `_quiet_orbax`."""
    for place in (folder, folder.parent):
        if place.exists() and not os.access(place, os.W_OK | os.X_OK):
            read_only = bool(os.statvfs(place).f_flag & os.ST_RDONLY)
            code = errno.EROFS if read_only else errno.EACCES
            raise WriteError(folder, OSError(code, os.strerror(code)))


def restore(run_dir: Path, state_template, rounds_key: jax.Array) -> Saved:
    """The latest checkpoint in `run_dir`, its state laid out like `state_template` (a state of
    the same run, e.g. freshly initialised: its shapes, dtypes and shardings are reused); an
    error if it was made with other PRNG keys than `rounds_key`."""
    return _read(run_dir, state_template, rounds_key)


def _read(run_dir: Path, state_template=None, rounds_key=None) -> Saved:
    import orbax.checkpoint as ocp

    folder = Path(run_dir) / FOLDER
    if not exists(run_dir):
        raise McflError(f"{str(run_dir)!r} holds no checkpoint to resume from (expected "
                        f"{str(folder)!r}; runs write one unless stopped before their first)")
    manager = _manager(folder)
    try:
        step = manager.latest_step()
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        if state_template is None:
            return Saved(step, None, meta["config"], meta["progress"], None)
        saved_arrays = manager.item_metadata(step)["arrays"]
        template = {"state": jax.tree.map(ocp.utils.to_shape_dtype_struct, state_template),
                    "rounds_key": np.zeros(saved_arrays["rounds_key"].shape, np.uint32)}
        if "assignments" in saved_arrays:
            shape = saved_arrays["assignments"].shape
            template["assignments"] = np.zeros(shape, np.int32)
        arrays = manager.restore(step, args=ocp.args.Composite(
            arrays=ocp.args.StandardRestore(template))).arrays
    except McflError:
        raise
    except Exception as e:  # a damaged or foreign folder: one line, naming it
        raise McflError(f"cannot read the checkpoint in {str(folder)!r}: "
                        f"{type(e).__name__}: {e}") from None
    finally:
        manager.close()
    if not np.array_equal(np.asarray(arrays["rounds_key"]),
                          np.asarray(jax.random.key_data(rounds_key))):
        raise McflError(f"the checkpoint in {str(folder)!r} was made with other PRNG keys "
                        "than this run's seed gives; it cannot be resumed as this run")
    return Saved(step, arrays["state"], meta["config"], meta["progress"],
                 arrays.get("assignments"))


class StopRequests:
    """While active (in the main thread), SIGINT and SIGTERM ask the training loop to stop at
    the end of the current host call (`requested`) instead of interrupting it; a second signal
    stops at once (KeyboardInterrupt). Elsewhere (another thread) signals are left alone."""

    def __init__(self):
        self.requested: Optional[int] = None
        self._previous: dict[int, Any] = {}
        self._deferring = False
        self._again = False  # a second signal came while deferring

    def _handle(self, signum, frame):
        if self.requested is not None and not self._deferring:
            raise KeyboardInterrupt(f"signal {signum}")
        if self.requested is not None:
            self._again = True
        self.requested = signum

    @contextlib.contextmanager
    def deferred(self):
        """A block a signal must not cut (a checkpoint being written): a second signal
        within it stops the run when the block ends, cleanly."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self._again:
            raise KeyboardInterrupt(f"signal {self.requested}")

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
