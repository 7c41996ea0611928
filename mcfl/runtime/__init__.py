"""Where a run runs: several processes (`distributed`) and JAX's persistent compilation cache
(`compile_cache`)."""
