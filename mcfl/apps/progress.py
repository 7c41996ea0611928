"""The command line's progress bars: shown on a terminal, off everywhere else.

A bar redraws itself with carriage returns many times a second; in a file (``mcfl demo >
log``, ``mcfl sweep ... > log 2>&1``, a batch job's output) every frame stays, and the log
fills with them. tqdm's own ``disable=None`` looks only at the stream it writes to (stderr),
so a bar still went to a terminal's stderr while the results went to a file, and into the
file with ``2>&1``: a bar is drawn only when both stdout and stderr are terminals.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


def on_terminal() -> bool:
    """Whether both stdout and stderr are terminals (looked up now: a caller may have
    redirected either)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is None or not stream.isatty():
                return False
        except (AttributeError, ValueError):  # no isatty, or a closed stream
            return False
    return True


def progress_bar(**tqdm_kwargs) -> tqdm:
    """A tqdm bar made with `tqdm_kwargs`, disabled unless both stdout and stderr are
    terminals (`on_terminal`); ``disable=True`` turns it off on a terminal too. A disabled
    bar takes every call (update, set_postfix, write, close) and prints nothing (its `write`
    prints the text)."""
    disable = tqdm_kwargs.pop("disable", False) or not on_terminal()
    return tqdm(disable=disable, **tqdm_kwargs)
