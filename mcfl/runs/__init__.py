"""The run: its execution plan (`execution`), its compiled programs (`program`, over any
client store: `stored_rounds` moves the rows of a host or disk one), the round loop (`loop`),
what it records (`records`), `mcfl.run` (`runner`) and resuming a stopped one (`resume`), and
what a run computes from its state (`evaluation`'s metrics, the clients' `embedding`, choosing
K with `select_k`)."""
