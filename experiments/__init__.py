"""The experiments' config files (installed with mcfl as the package `mcfl.experiments`, so that
`mcfl reproduce` reads the same files from a checkout or an installed wheel). Each is a config
for `mcfl run --config FILE` too; its comments give the commands and their measured cost."""
