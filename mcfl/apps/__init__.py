"""The applications built on the library: the command line, run folders (CSV, JSON, PNG),
benchmarks, the demo, comparisons and plots. The library proper (`mcfl.run`, the config, the
algorithms, the engine) never prints, draws or writes on its own; these modules do."""
