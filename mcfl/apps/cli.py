"""The `mcfl` command line: `mcfl run`, `mcfl sweep`, `mcfl reproduce`, `mcfl data`,
`mcfl compare`, `mcfl plot`, `mcfl select-k`, `mcfl demo`, `mcfl plan`, `mcfl bench`.

Every setting of `RunConfig` and every hyperparameter of a registered algorithm is a flag
(``local_epochs`` -> ``--local-epochs``, ``fesem_lambda`` -> ``--fesem-lambda``), with its help
and default taken from the config and the registry; ``--config FILE`` loads a JSON / TOML file
whose values the flags given on the command line override.
Bad input ends in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
import threading
from typing import Optional

from mcfl.apps import bench
from mcfl.apps.bench_suite import SUITES
from mcfl.apps.commands import (
    cmd_bench,
    cmd_compare,
    cmd_data_describe,
    cmd_data_export,
    cmd_data_plot,
    cmd_demo,
    cmd_models,
    cmd_plot_clusters,
    cmd_reproduce,
    cmd_run,
    cmd_select_k,
    cmd_sweep,
)
from mcfl.apps.flags import (
    DATA_FLAGS,
    Parser,
    add_cache_flags,
    add_compile_cache_flag,
    add_config_flags,
    add_log_flag,
    add_overwrite_flag,
    add_verbose_flag,
    check_cache_dir,
    setup_compile_cache,
)
from mcfl.apps.libtpu_environment import quiet_libtpu_without_tpu
from mcfl.apps.logs import library_logs
from mcfl.apps.plan_command import cmd_plan
from mcfl.apps.user_environment import memory_limit
from mcfl.config import SHARED_FIELDS, hint_of
from mcfl.data.export import FORMATS
from mcfl.errors import ConfigError, McflError
from mcfl.planning.targets import DEFAULT as DEFAULT_TARGETS
from mcfl.planning.targets import NAMES
from mcfl.runtime.memory import limited, out_of_memory
from mcfl.settings import TextParser


def _add_bench_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algorithms", default=",".join(bench.DEFAULT_ALGORITHMS),
                        help="comma-separated algorithms (default %(default)s)")
    parser.add_argument("--models", default=",".join(bench.DEFAULT_MODELS),
                        help="comma-separated models: mclr (60 -> 10), mlp (784-200-200-10), "
                        "cnn-fmnist (FlexCFL's FashionMNIST CNN) (default %(default)s)")
    parser.add_argument("--clients", default=None,
                        help="comma-separated client counts (default 100,1000,10000,100000; "
                        "the MLP stops at 10,000 unless --clients is given)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per point; round 1 compiles, the median of the rest is "
                        "s/round (default %(default)s)")
    parser.add_argument("--clusters", type=int, default=4,
                        help="K of the clustered algorithms and of the clustering step "
                        "(default %(default)s)")
    parser.add_argument("--rows-per-client", type=int, default=50,
                        help="training rows of every client (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=10, help="B (default %(default)s)")
    parser.add_argument("--clients-per-round", type=TextParser(hint_of("clients_per_round")),
                        default=1.0,
                        help="clients training each round: a count (capped at each point's "
                        "clients) or a fraction (default 1.0: all)")
    parser.add_argument("--conv", default="auto", help=SHARED_FIELDS["conv"].metadata["doc"]
                        + " (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of data and runs")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds before a point is stopped and recorded as failed "
                        "(default %(default)g)")
    parser.add_argument("--clustering", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the clustering step alone (k-means, as FeSEM's "
                        "initialisation runs it) at every client count")
    parser.add_argument("--out", default="runs/bench", metavar="DIR",
                        help="where bench.json and bench.png go (default %(default)s)")
    parser.add_argument("--suite", choices=SUITES,
                        help="accelerator: the GPU / TPU workloads in one folder (FedAvg MLP "
                        "10,000 clients a round, the FMNIST CNN 20 and 200 a round, --conv xla "
                        "against matmul, sweeps of 1 / 8 / 32 members, FeSEM at 1,000,000 "
                        "clients, block sizes, FlexCFL's FashionMNIST-CNN table cells), each "
                        "beside mcfl plan's bound; the sweep flags above are ignored")
    parser.add_argument("--tiny", action="store_true",
                        help="with --suite: every workload at test size (minutes on a CPU)")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="with --suite: the folder of Fashion-MNIST's IDX files for the "
                        "table cells (default: Debian's)")
    parser.add_argument("--only", metavar="LABELS",
                        help="with --suite: only workloads whose labels start with these "
                        "(comma-separated, e.g. cnn,table)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mcfl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p_run = sub.add_parser("run", help="train one algorithm and write its results")
    add_config_flags(p_run)
    add_cache_flags(p_run)
    add_compile_cache_flag(p_run)
    p_run.add_argument("--out", metavar="DIR", help="output folder (default runs/NAME)")
    add_overwrite_flag(p_run, "run")
    p_run.add_argument("--resume", metavar="RUN_DIR",
                       help="continue the run stopped in RUN_DIR from its checkpoint, with its "
                       "own config (no other settings); the result equals an uninterrupted run")
    p_run.add_argument("--checkpoint-every", type=int, metavar="N",
                       help="checkpoint every N rounds (default: every 5 minutes; always at "
                       "the end and on Ctrl-C / SIGTERM)")
    p_run.add_argument("--coordinator", metavar="HOST:PORT",
                       help="multi-process run: the address of process 0 (docs: accelerators)")
    p_run.add_argument("--num-processes", type=int, metavar="N",
                       help="multi-process run: how many processes take part")
    p_run.add_argument("--process-id", type=int, metavar="I",
                       help="multi-process run: this process's rank, 0 .. N-1 (0 writes --out)")
    p_run.add_argument("--profile", metavar="DIR",
                       help="write a jax.profiler trace of rounds 2-3 to DIR (with "
                       "--scan-rounds: of the second chunk of rounds)")
    add_log_flag(p_run, "the run")
    add_verbose_flag(p_run)
    p_run.set_defaults(func=cmd_run)

    p_sweep = sub.add_parser(
        "sweep", help="many seeds and hyperparameter values as one vmapped program: "
        "mean / std tables and band plots")
    add_config_flags(p_sweep)
    add_cache_flags(p_sweep)
    add_compile_cache_flag(p_sweep)
    p_sweep.add_argument("--seeds", metavar="LIST",
                         help="seeds of every grid point: 0-7 or 0,3,5 (default 0)")
    p_sweep.add_argument("--grid", action="append", metavar="NAME=V1,V2",
                         help="a setting and its values (repeatable; every combination runs)")
    p_sweep.add_argument("--algorithms", metavar="A,B",
                         help="a grid over algorithms, e.g. fedavg,fesem")
    p_sweep.add_argument("--data-seeds", metavar="LIST",
                         help="also vary the dataset's seed (each its own group); default "
                         "one dataset, the config's data seed")
    p_sweep.add_argument("--members-per-chunk", type=int, metavar="N",
                         help="most members per program (default: as many as fit in memory)")
    p_sweep.add_argument("--out", metavar="DIR", help="output folder (default runs/sweep)")
    add_overwrite_flag(p_sweep, "sweep")
    p_sweep.add_argument("--resume", metavar="SWEEP_DIR",
                         help="finish the sweep stopped in SWEEP_DIR with its own settings (no "
                         "others): finished members are kept, the chunk under way continues "
                         "from its checkpoint; the tables equal an uninterrupted sweep's")
    p_sweep.add_argument("--checkpoint-every", type=int, metavar="N",
                         help="checkpoint the members under way every N rounds (default: every "
                         "5 minutes; always on Ctrl-C / SIGTERM)")
    add_log_flag(p_sweep, "each member (a tracking run each, grouped by grid point)")
    add_verbose_flag(p_sweep)
    p_sweep.set_defaults(func=cmd_sweep)

    p_reproduce = sub.add_parser(
        "reproduce", help="a paper's table: every cell over seeds, beside the paper's values")
    p_reproduce.add_argument("name", nargs="?", metavar="NAME",
                             help="the table (mcfl reproduce --list)")
    p_reproduce.add_argument("--list", action="store_true",
                             help="the tables, with their expected cost")
    p_reproduce.add_argument("--quick", action="store_true",
                             help="the reduced form (minutes on a 2-core CPU; --list says "
                             "what it reduces)")
    p_reproduce.add_argument("--seeds", type=int, metavar="N",
                             help="seeds per cell (default: 3 full, the table's for --quick)")
    p_reproduce.add_argument("--out", metavar="DIR",
                             help="default runs/reproduce/NAME[-quick]")
    p_reproduce.add_argument("--cells", metavar="A,B",
                             help="only these cells: their labels in table.md, e.g. "
                             "FedAvg,IFCA, or shell patterns, e.g. 'FEMNIST *'")
    p_reproduce.add_argument("--data-dir", metavar="DIR",
                             help="the table's data: fesem-table1 (full): LEAF's data folder "
                             "(femnist/data, celeba/data inside); Fashion-MNIST tables: a "
                             "folder with its IDX files (default: Debian's)")
    add_overwrite_flag(p_reproduce, "table")
    p_reproduce.add_argument("--resume", metavar="TABLE_DIR",
                             help="finish the table stopped in TABLE_DIR with its own settings: "
                             "finished cells are kept, a cell stopped midway continues from "
                             "its checkpoint")
    add_cache_flags(p_reproduce)
    add_compile_cache_flag(p_reproduce)
    add_verbose_flag(p_reproduce)
    p_reproduce.set_defaults(func=cmd_reproduce)

    p_data = sub.add_parser("data", help="inspect a federated dataset")
    data_sub = p_data.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    p_describe = data_sub.add_parser("describe", help="clients, samples and classes per client")
    p_plot = data_sub.add_parser("plot", help="PNG heat map of the labels of each client")
    p_export = data_sub.add_parser(
        "export", help="write the dataset as mcfl trains on it (each client's train / test "
        "rows, client ids, planted clusters) as LEAF JSON or npz, for other code to read")
    for p in (p_describe, p_plot, p_export):
        add_config_flags(p, DATA_FLAGS)
        add_cache_flags(p)
    p_describe.add_argument("--json", action="store_true", help="print JSON")
    p_describe.set_defaults(func=cmd_data_describe)
    p_plot.add_argument("--out", default="label_distribution.png", metavar="PNG")
    p_plot.set_defaults(func=cmd_data_plot)
    p_export.add_argument("--format", choices=FORMATS, default="leaf",
                          help="leaf: train/ and test/ JSON as LEAF writes them (rows "
                          "flattened), true_cluster.json beside; npz: one data.npz")
    p_export.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    add_overwrite_flag(p_export, "export")
    p_export.set_defaults(func=cmd_data_export)

    p_models = sub.add_parser("models", help="the registered models (--model NAME), with their "
                              "arguments (--model-args)")
    p_models.set_defaults(func=cmd_models)

    p_compare = sub.add_parser("compare", help="table and accuracy-vs-communication plot of runs")
    p_compare.add_argument("--runs", nargs="+", required=True, metavar="DIR")
    p_compare.add_argument("--x", default="comm", choices=("comm", "sim_time", "round"),
                           help="the plot's horizontal axis: parameters communicated, "
                           "simulated seconds (runs with clients as they are) or rounds")
    p_compare.add_argument("--out", default="compare.png", metavar="PNG")
    p_compare.set_defaults(func=cmd_compare)

    p_plot_top = sub.add_parser("plot", help="plots of a run folder")
    plot_sub = p_plot_top.add_subparsers(dest="plot_command", required=True, parser_class=Parser)
    p_clusters = plot_sub.add_parser(
        "clusters", help="clients' local models in 2-D (PCA), coloured by cluster")
    p_clusters.add_argument("run_dir", metavar="RUN_DIR")
    p_clusters.add_argument("--out", metavar="PNG", help="default RUN_DIR/clusters.png")
    p_clusters.set_defaults(func=cmd_plot_clusters)

    p_select = sub.add_parser(
        "select-k", help="compare candidate K on a sample of clients for a few rounds")
    add_config_flags(p_select)
    add_cache_flags(p_select)
    add_compile_cache_flag(p_select)
    p_select.add_argument("--k", required=True, metavar="LIST",
                          help="candidate K values, e.g. 2,3,4,5,6")
    p_select.add_argument("--sample", type=int, default=None,
                          help="clients sampled for the trials (default: 100, or every client "
                          "of a dataset with fewer)")
    p_select.add_argument("--candidate-rounds", type=int, default=3,
                          help="rounds per candidate (default %(default)s)")
    p_select.add_argument("--tolerance", type=float, default=0.005,
                          help="accuracy within which a smaller K is preferred (default "
                          "%(default)s)")
    p_select.add_argument("--out", default="runs/select-k", metavar="DIR")
    add_verbose_flag(p_select)
    p_select.set_defaults(func=cmd_select_k)

    p_demo = sub.add_parser(
        "demo", help="baselines on Synthetic(1,1); FeSEM and IFCA on planted clusters"
    )
    p_demo.add_argument("--out", default="runs/demo", metavar="DIR")
    p_demo.add_argument("--rounds", type=int, default=None, help="override the demo's rounds")
    p_demo.add_argument("--clients", type=int, default=None, help="override the demo's clients")
    add_compile_cache_flag(p_demo)
    add_verbose_flag(p_demo)
    p_demo.set_defaults(func=cmd_demo)

    p_plan = sub.add_parser(
        "plan", help="what a run needs (FLOPs, bytes, memory, sizes) and, for GPUs and TPUs, "
        "whether it fits and the least time it can take; builds the programs, trains nothing")
    add_config_flags(p_plan)
    add_cache_flags(p_plan)
    p_plan.add_argument("--target", action="append", metavar="NAME",
                        help="machines to size the run for (repeatable or comma-separated): "
                        f"{', '.join(NAMES)}, all (default {','.join(DEFAULT_TARGETS)})")
    p_plan.add_argument("--json", action="store_true", help="print JSON")
    add_verbose_flag(p_plan)
    p_plan.set_defaults(func=cmd_plan)

    p_bench = sub.add_parser(
        "bench", help="round time, samples/s and peak memory against the number of clients"
    )
    _add_bench_flags(p_bench)
    add_compile_cache_flag(p_bench)
    p_bench.set_defaults(func=cmd_bench)
    return parser


def _stop_on_sigterm(signum, frame):
    """SIGTERM stops a run the way Ctrl-C does: the rounds so far are kept and summary.json
    records the stop (status "interrupted")."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[list[str]] = None) -> int:
    """The `mcfl` command with the arguments `argv` (None: the program's own, sys.argv). Run
    as the program (argv None: the `mcfl` script, ``python -m mcfl``), it first names libtpu's
    placeholder environment where no TPU is (`quiet_libtpu_without_tpu`); called from Python
    with its arguments it leaves the caller's environment as it is."""
    if argv is None:
        quiet_libtpu_without_tpu()  # before JAX starts a backend
    parser = build_parser()
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        check_cache_dir(args)
        # MCFL_MEMORY_LIMIT, read here and passed on: the memory checks' budget for the command
        with limited(memory_limit()):
            if args.command in ("run", "sweep", "reproduce", "demo", "bench", "select-k"):
                setup_compile_cache(args)
            # the commands that build programs print their results, not XLA's or the
            # libraries' log lines, unless --verbose (the others have no flag and log as they do)
            with library_logs(getattr(args, "verbose", True)):
                return args.func(args)
    except (McflError, ConfigError) as e:
        print(f"mcfl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mcfl: interrupted; rounds finished so far are in the output folder", file=sys.stderr)
        return 130
    except OSError as e:  # a file mcfl does not write through mcfl.files.atomic (a cache, a plot)
        if e.errno not in WRITE_FAULTS:
            raise
        where = f" {e.filename!r}" if e.filename else ""
        print(f"mcfl: error: cannot write{where}: {e.strerror}", file=sys.stderr)
        return 2
    except Exception as e:  # memory the estimates did not foresee
        oom = out_of_memory(e)
        if oom is None:
            raise
        print(f"mcfl: error: {oom}", file=sys.stderr)
        return 2


# Disk and permission failures reported in one line: a full disk or quota, a lost permission,
# a read-only file system.
WRITE_FAULTS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)


if __name__ == "__main__":
    sys.exit(main())
