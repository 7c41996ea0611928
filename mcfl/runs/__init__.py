"""The run: its execution plan (`execution`), its compiled programs (`program` on the device,
`stored_program` with a host or disk client store), the round loop (`loop`), what it records
(`records`), `mcfl.run` (`runner`) and resuming a stopped one (`resume`), and what a run
computes from its state (`evaluation`'s metrics, the clients' `embedding`, choosing K with
`select_k`)."""
