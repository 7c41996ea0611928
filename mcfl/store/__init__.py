"""Client stores: where what clients keep between rounds lives when it is not on the device
(the device's rows are part of the run's state, `mcfl.algorithms.framework.device`): host memory or
disk (`stores`, one file per client and generation in `files`, rows packed as bytes by `layout`),
which store a run uses and why (`choose`), and a population start streamed through one
(`start`). `rows` moves their rows to and from a round program's rounds
(`mcfl.runs.stored_rounds`).
"""

FOLDER = "client_store"  # in a run's folder
