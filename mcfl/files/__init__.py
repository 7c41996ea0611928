"""Files and faults: the run folder (`run_folder`), checkpoints (`checkpoint`), atomic writes
(`atomic`), fault points for the tests (`faults`), figures (`figures`)."""
