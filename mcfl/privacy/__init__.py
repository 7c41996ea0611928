"""Client-level differential privacy: the Gaussian mechanism as a message transform
(`mechanism`), its accounting with dp-accounting (`accounting`), Poisson sampling of the
round's clients (`sampling`) and an empirical check of the guarantee with canary clients
(`empirical`)."""
