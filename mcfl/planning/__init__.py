"""`mcfl plan`'s estimates: what a program computes (`cost`), what a run needs (`estimate`),
the machines it is sized for (`targets`), and lowering for accelerators this machine does not
have (`lowering`)."""
