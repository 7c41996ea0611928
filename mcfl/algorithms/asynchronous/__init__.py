"""Asynchronous servers on the simulated clock (`servers`: FedBuff, FedAsync, IFCA-async)."""
