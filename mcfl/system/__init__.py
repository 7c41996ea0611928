"""Clients as they are: a device for every client (compute speed, network, availability), a
simulated clock, and what that does to a round (dropouts, stragglers, deadlines,
over-selection) or to the server when it does not wait for rounds (asynchronous aggregation).

* `mcfl.system.devices`: the population's devices, drawn from named distributions or read from
  a trace file (`mcfl.system.trace`), and the `SystemModel` a config describes;
* `mcfl.system.clock`: when each client of a round finishes, who reports, how long the round
  lasts;
* `mcfl.system.state`: the devices and the clock a run carries, and drawing a round's clients
  among those online (any algorithm's rounds under a device model, stage (a) of the round
  skeleton, are `mcfl.algorithms.wrappers.system_rounds.with_system`);
* `mcfl.system.events`: the in-flight clients of an asynchronous server and the ring of recent
  global models they started from (FedBuff, FedAsync: `mcfl.algorithms.asynchronous.servers`).
"""
