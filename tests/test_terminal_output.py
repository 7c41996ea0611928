"""What reaches the user's terminal: progress bars only when stdout and stderr are both
terminals (`mcfl.apps.progress`), and no XLA or library log line from the commands that build
programs unless --verbose (`mcfl.apps.logs`)."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mcfl.apps import demo, logs
from mcfl.apps.cli import build_parser, main
from mcfl.apps.progress import on_terminal, progress_bar
from mcfl.config import RunConfig

ROOT = Path(__file__).parent.parent


class Terminal(io.StringIO):
    """A stream that says it is a terminal (what tqdm and `on_terminal` ask)."""

    def isatty(self) -> bool:
        return True


def test_a_bar_is_drawn_only_when_stdout_and_stderr_are_both_terminals(monkeypatch):
    for stdout_tty in (False, True):
        for stderr_tty in (False, True):
            monkeypatch.setattr(sys, "stdout", Terminal() if stdout_tty else io.StringIO())
            monkeypatch.setattr(sys, "stderr", Terminal() if stderr_tty else io.StringIO())
            bar = progress_bar(total=3, desc="x")
            assert bar.disable is not (stdout_tty and stderr_tty) and \
                on_terminal() is (stdout_tty and stderr_tty)
            bar.update(1)
            bar.set_postfix(acc="0.5")  # a disabled bar takes every call
            bar.close()
    assert progress_bar(total=3, disable=True).disable  # off on a terminal when asked
    monkeypatch.setattr(sys, "stdout", None)  # (pythonw, a detached process)
    assert not on_terminal()


def _tiny_demo(monkeypatch):
    """The demo's loop on one small experiment of one algorithm (the real one compiles six
    algorithms for minutes)."""
    config = RunConfig(dataset="synthetic", clients=6, rounds=3, clients_per_round=3,
                       eval_every=1, seed=0)
    monkeypatch.setattr(demo, "EXPERIMENTS", (
        demo.Experiment("synthetic", "tiny", config, {"fedavg": {}}),))


@pytest.mark.parametrize("stdout_is_terminal", [False, True])
def test_mcfl_demo_to_a_file_writes_no_progress_frames(tmp_path, monkeypatch,
                                                       stdout_is_terminal):
    """`mcfl demo > log` from a terminal (stderr still one): neither the log nor the
    terminal gets the bar's frames; both on terminals (the control): the bar is drawn."""
    _tiny_demo(monkeypatch)
    stderr = Terminal()
    with (tmp_path / "log").open("w+") as log:
        stdout = Terminal() if stdout_is_terminal else log
        monkeypatch.setattr(sys, "stdout", stdout)
        monkeypatch.setattr(sys, "stderr", stderr)
        assert main(["demo", "--out", str(tmp_path / "demo"), "--no-compile-cache"]) == 0
        monkeypatch.undo()
    written = stdout.getvalue() if stdout_is_terminal else (tmp_path / "log").read_text()
    frames = stderr.getvalue()
    assert "fedavg" in written and "acc micro" in written  # the demo's table
    if stdout_is_terminal:  # a bar's frames: carriage returns, its count and its rate
        assert "\r" in frames and "3/3 [" in frames and "round" in frames, frames
    else:
        for text in (written, frames):
            assert "\r" not in text and "3/3 [" not in text and "it/s" not in text, text


def test_quiet_logs_are_off_for_the_command_and_back_after_it(monkeypatch):
    names = ("jax._src.compiler", "absl", "orbax.checkpoint")
    # (as a fresh process has them: a failed checkpoint save earlier in this worker leaves
    # orbax's and absl's loggers silenced, mcfl.files.checkpoint._quiet_orbax)
    for name in ("jax", "jaxlib", "absl", "orbax", *names):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)
    logging.getLogger().manager._clear_cache()
    before = [logging.getLogger(n).getEffectiveLevel() for n in names]
    with logs.library_logs(verbose=False):
        assert not any(logging.getLogger(n).isEnabledFor(logging.WARNING) for n in names)
        assert all(logging.getLogger(n).isEnabledFor(logging.ERROR) for n in names)
    assert [logging.getLogger(n).getEffectiveLevel() for n in names] == before
    with logs.library_logs(verbose=True):
        assert [logging.getLogger(n).getEffectiveLevel() for n in names] == before
    for command in ("plan", "run", "sweep", "reproduce", "demo", "select-k"):
        extra = ["fesem-table1"] if command == "reproduce" else \
            ["--k", "2"] if command == "select-k" else []
        args = build_parser().parse_args([command, *extra, "--verbose"])
        assert args.verbose is True
        assert build_parser().parse_args([command, *extra]).verbose is False


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(MCFL_NO_COMPILE_CACHE="1", PYTHONPATH=str(ROOT), **extra)
    return env


@pytest.mark.parametrize("verbose", [False, True])
def test_xla_logs_of_a_command_reach_the_terminal_only_with_verbose(verbose):
    """XLA's C++ lines as the backend starts (asked for with TF_CPP_MIN_LOG_LEVEL=0, which
    makes them certain) are off in `mcfl plan`, which answers with its estimate and one line;
    --verbose leaves them."""
    argv = [sys.executable, "-m", "mcfl", "plan", "--clients", "100000000", "--no-cache",
            "--target", "t4"] + (["--verbose"] if verbose else [])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env=_env(TF_CPP_MIN_LOG_LEVEL="0"))
    assert proc.returncode == 2
    assert "does NOT fit" in proc.stdout
    if verbose:
        assert "pjrt_client.cc" in proc.stderr, proc.stderr  # (the control: lines were logged)
    else:
        assert proc.stderr.startswith("mcfl: error: synthetic with 100,000,000 clients")
        assert proc.stderr.count("\n") == 1, proc.stderr


# A command whose compilation makes XLA raise its constant-folding alarm (a cumulative sum of
# a constant: XLA's evaluator folds it for over a second, 20,000 rows of it on the fastest CPU
# it met: 4,000 did not on a Xeon), beside Python libraries' warnings.
NOISY = textwrap.dedent("""
    import logging, sys
    import absl.logging
    import jax, jax.numpy as jnp
    from mcfl.apps import cli

    def noisy(args):
        logging.getLogger("jax._src.dispatch").warning("a jax warning")
        absl.logging.warning("an absl warning")
        logging.getLogger("orbax.checkpoint").warning("an orbax warning")
        constant = jnp.broadcast_to(jnp.arange(16.0), (20000, 16))
        jax.jit(lambda: jax.lax.cumsum(constant, axis=1))().block_until_ready()
        print("planned")
        return 0

    cli.cmd_plan = noisy
    sys.exit(cli.main(["plan", *sys.argv[1:]]))
""")


@pytest.mark.parametrize("verbose", [False, True])
def test_xlas_constant_folding_alarm_and_library_warnings_need_verbose(verbose):
    proc = subprocess.run([sys.executable, "-c", NOISY] + (["--verbose"] if verbose else []),
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0 and proc.stdout == "planned\n", proc.stderr
    lines = ("Constant folding an instruction is taking", "a jax warning", "an absl warning",
             "an orbax warning")
    if verbose:  # (the control: each was logged)
        assert all(line in proc.stderr for line in lines), proc.stderr
    else:
        assert proc.stderr == ""
