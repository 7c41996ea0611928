"""The experiments' config files (installed with mcfl as the package `mcfl.experiments`, so that
`mcfl reproduce` reads the same files from a checkout or an installed wheel). Each is a config
for `mcfl run --config FILE` too; its comments give the commands and their measured cost. The
tables themselves (cells, the papers' values, the full and quick forms) are in tables/, one
NAME.toml a table (`mcfl.reproduce.tables`); those are not run configs."""
