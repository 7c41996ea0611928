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

import signal
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from mcfl.errors import McflError

FOLDER = "checkpoints"
# Default interval when no --checkpoint-every is given: a checkpoint costs a write of the
# state, so it is taken by time (and at every stop), not every round.
DEFAULT_SECONDS = 300.0


class Saved(NamedTuple):
    """What a checkpoint gives back."""

    round: int  # the last round finished
    state: Any
    config: dict[str, Any]  # RunConfig.to_dict() of the run
    progress: dict[str, Any]  # rows, round_seconds and assignment rounds recorded so far
    assignments: Optional[np.ndarray]  # [E, C] clusters after each evaluated round


def _manager(folder: Path):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False,
                                           create=True)
    handlers = {"arrays": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(folder.absolute(), options=options, item_handlers=handlers)


def check_every(every) -> None:
    if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                              or every < 1):
        raise McflError(f"checkpoint_every must be an integer >= 1 (rounds), got {every!r}")


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

    def save(self, round_: int, state, rounds_key: jax.Array, config: dict[str, Any],
             progress: dict[str, Any], assignments: list[np.ndarray]) -> None:
        import orbax.checkpoint as ocp

        if self._manager is None:
            self._manager = _manager(self.folder)
        arrays = {"state": state, "rounds_key": np.asarray(jax.random.key_data(rounds_key))}
        if assignments:
            arrays["assignments"] = np.stack(assignments)
        meta = {"round": round_, "config": config, "progress": progress}
        self._manager.save(round_, args=ocp.args.Composite(
            arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)), force=True)
        self._manager.wait_until_finished()
        self._last_round = round_
        self._last_time = time.monotonic()

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None


def latest(run_dir: Path) -> Saved:
    """The latest checkpoint in `run_dir` without its arrays (its round, config and records);
    an error naming the folder if there is none, or if that run had already finished."""
    saved = _read(run_dir)
    if saved.round >= saved.config["rounds"]:
        raise McflError(f"the run in {str(run_dir)!r} already finished all "
                        f"{saved.config['rounds']} rounds; there is nothing to resume")
    return saved


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

    def _handle(self, signum, frame):
        if self.requested is not None:
            raise KeyboardInterrupt(f"signal {signum}")
        self.requested = signum

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
