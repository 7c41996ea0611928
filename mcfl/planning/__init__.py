"""`mcfl plan`'s estimates: what a program computes (`cost`), what a run needs (`estimate`,
`memory`, which the run also checks before it allocates), the machines it is sized for
(`targets`), and lowering for accelerators this machine does not have (`lowering`)."""
