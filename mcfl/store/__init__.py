"""Client stores: where what clients keep between rounds lives (device, host memory, disk).

`run_program` gives a run its round program: the device's (`mcfl.program.RoundProgram`,
everything in the algorithm's state), or a `StoredProgram` whose client rows or population
start go through a host or disk store (`mcfl.store.choose` says which, and why).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Optional

from mcfl import distributed
from mcfl.algorithms import hyperparams
from mcfl.config import RunConfig
from mcfl.errors import ConfigError
from mcfl.program import RoundProgram, round_program
from mcfl.store.choose import StoreChoice, choose_store
from mcfl.store.program import StoredProgram

FOLDER = "client_store"  # in a run's folder

__all__ = ["FOLDER", "StoreChoice", "StoredProgram", "announce", "choose_store", "run_program"]


def announce(choice: StoreChoice) -> None:
    """Say on stderr which store a run uses and why, unless it is the device."""
    if choice.kind != "device":
        print(f"mcfl: client store: {choice.kind} ({choice.reason})", file=sys.stderr)


def run_program(config: RunConfig, plan, data, run_dir: Optional[Path],
                jit_options: Optional[dict] = None, members: bool = False, traced=(),
                member_count: int = 1, mesh=None, width=None, transform=None
                ) -> tuple[RoundProgram, StoreChoice]:
    """The program of `config` with the client store it asks for (a disk store in
    ``run_dir/client_store``, or without a run folder a temporary folder the program removes
    when closed), and the store chosen. `transform`: the run's message transform."""
    extra = () if transform is None else (transform,)
    device = round_program(config, plan, data, traced, members, mesh, width, jit_options,
                           *extra)
    choice = choose_store(config.client_store, device.algorithm, config.algorithm,
                          hyperparams(config, plan.model), data, member_count)
    if choice.kind == "device":
        return device, choice
    if distributed.process_count() > 1:
        raise ConfigError(f"client_store={choice.kind!r} ({choice.reason}) runs in one "
                          f"process; a multi-process run keeps client state on the devices")
    temporary = run_dir is None and choice.kind == "disk"
    folder = (Path(tempfile.mkdtemp(prefix="mcfl-store-")) if temporary
              else None if run_dir is None else Path(run_dir) / FOLDER)
    if config.scan_rounds:
        choice = choice._replace(reason=f"{choice.reason}; its rounds run one at a time "
                                 f"(scan_rounds needs the client state on the device)")
    program = StoredProgram(config, plan, choice.kind, folder, traced, members, mesh, width,
                            jit_options, transform)
    program.temporary = temporary
    return program, choice
