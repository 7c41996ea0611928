"""Where a run runs: several processes (`distributed`), JAX's persistent compilation cache
(`compile_cache`), and the memory this machine has and a run needs (`memory`)."""
