"""``--log tensorboard:DIR``: a run's event file, written with the tensorboard package's own
writer and protocol buffers, without TensorFlow.

A run writes to DIR itself (point TensorBoard at DIR's parent to compare several runs); a
sweep member to DIR/GRID_POINT/seed-S (`Tracker.member`), so TensorBoard lists the members
by grid point. The config goes to the HParams dashboard (a session-start summary, as
``hp.hparams`` writes it), every round's numbers are scalars at step = the round (32-bit
floats, TensorBoard's own precision), the summary's numbers are ``summary/KEY`` scalars at the
last round, and the plots images (tag ``plots/NAME``).
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

from mcfl.tracking.base import Tracker, hyperparameters, path_part, summary_metrics

# Seconds between the writer's flushes to disk: a run watched live shows its rounds this late
# at most.
FLUSH_SECONDS = 5


class TensorBoard(Tracker):
    """Event files under `folder` (TensorBoard's ``--logdir``)."""

    kind = module = "tensorboard"

    def __init__(self, folder: str | Path):
        super().__init__()
        self.folder = Path(folder)
        self._writer = None

    @property
    def logdir(self) -> Path:
        """Where the events go: `folder`, or a member's subfolder of it."""
        if self.group is None:
            return self.folder
        return self.folder / path_part(self.group) / path_part(self.name)

    def open(self, config, name: str) -> None:
        from tensorboard.plugins.hparams import summary_v2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(str(self.logdir), flush_secs=FLUSH_SECONDS)
        self._write(summary_v2.hparams_pb(hyperparameters(config), trial_id=name), 0)

    def log(self, values: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto import summary_pb2

        self._write(summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=key, simple_value=value)
            for key, value in values.items()]), step)

    def close(self, summary: dict[str, Any], plots: list[Path]) -> None:
        from tensorboard.compat.proto import summary_pb2

        self.log(summary_metrics(summary), self.step)
        for path in plots:
            self._write(summary_pb2.Summary(value=[summary_pb2.Summary.Value(
                tag=f"plots/{path.stem}", image=_image(path.read_bytes()))]), self.step)
        self._writer.close()
        self._writer = None

    def _write(self, summary, step: int) -> None:
        from tensorboard.compat.proto import event_pb2

        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                               summary=summary))


def _image(png: bytes):
    """An image summary of a PNG file's bytes (its size read from the PNG header)."""
    from tensorboard.compat.proto import summary_pb2

    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk, right after the magic
    return summary_pb2.Summary.Image(height=height, width=width, colorspace=4,
                                     encoded_image_string=png)
