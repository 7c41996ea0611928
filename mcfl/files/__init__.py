"""Files and faults: the run folder (`run_folder`), checkpoints and resuming (`checkpoint`,
`resume`), atomic writes (`atomic`), fault points for the tests (`faults`), figures
(`figures`)."""
