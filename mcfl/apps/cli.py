"""The `mcfl` command line: `mcfl run`, `mcfl sweep`, `mcfl reproduce`, `mcfl data`,
`mcfl compare`, `mcfl plot`, `mcfl select-k`, `mcfl demo`, `mcfl bench`.

Every setting of `RunConfig` and every hyperparameter of a registered algorithm is a flag
(``local_epochs`` -> ``--local-epochs``, ``fesem_lambda`` -> ``--fesem-lambda``), with its help
and default taken from the config and the registry; ``--config FILE`` loads a JSON / TOML file
whose values the flags given on the command line override.
Bad input ends in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import typing
from pathlib import Path
from typing import Any, Optional

from mcfl.config import SHARED_FIELDS, RunConfig, all_keys, from_dict, load_file, parse_hidden
from mcfl.errors import ConfigError, McflError

DATA_FLAGS = ("dataset", "data_dir", "download", "partition", "clients", "samples_per_client",
              "seed", "data_seed",
              "test_fraction", "normalize", "synthetic_alpha", "synthetic_beta")


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line with exit code 2 (no usage dump)."""

    def error(self, message):  # noqa: D401 - argparse's hook
        self.exit(2, f"mcfl: error: {message}\n")


def _count_or_fraction(text: str):
    try:
        return float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count or a fraction, got {text!r}") from None


def _flag_type(hint):
    """The argparse type of a setting's type hint (its check comes later, in the config)."""
    if typing.get_origin(hint) is tuple:
        return parse_hidden
    args = [t for t in typing.get_args(hint) if t is not type(None)]
    if set(args) == {int, float}:
        return _count_or_fraction
    return (args or [hint])[0]


def _help(doc: str, default, owners=()) -> str:
    where = f"[{', '.join(owners)}] " if owners else ""
    shown = "" if default is None else f" (default {default})"
    return (where + doc + shown).replace("%", "%%")


def _flag_settings(names=None):
    """(flat key, type hint, help) of every flag: the shared settings, then each
    hyperparameter of the registered algorithms once (with the algorithms that take it)."""
    from mcfl import settings
    from mcfl.algorithms import registry

    out = []
    for name, field in SHARED_FIELDS.items():
        if names is None or name in names:
            doc = field.metadata["doc"]
            if name == "algorithm":
                doc = " | ".join(registry.names())
            out.append((name, settings.type_of(RunConfig, field), _help(doc, field.default)))
    if names is not None:
        return out
    for key, owners in registry.owners_of_keys().items():
        spec = registry.get(owners[0])
        field = settings.fields_of(spec.params)[key]
        defaults = {settings.fields_of(registry.get(o).params)[key].default for o in owners}
        default = field.default if len(defaults) == 1 else None
        out.append((key, settings.type_of(spec.params, field),
                    _help(settings.doc_of(field), default, owners)))
    return out


def add_config_flags(parser: argparse.ArgumentParser, names=None) -> None:
    """A flag for every setting (`names`: only these shared ones), derived from the config
    and the algorithm registry."""
    parser.add_argument("--config", metavar="FILE", help="JSON or TOML config file")
    for key, hint, help_text in _flag_settings(names):
        flag = "--" + key.replace("_", "-")
        if hint is bool:
            parser.add_argument(flag, dest=key, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, dest=key, type=_flag_type(hint),
                                default=argparse.SUPPRESS, help=help_text)


def add_cache_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", metavar="DIR",
                        help="where prepared datasets are cached (default $MCFL_CACHE_DIR "
                        "or ~/.cache/mcfl)")
    parser.add_argument("--no-cache", action="store_true",
                        help="neither read nor write the dataset cache")


def add_compile_cache_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-compile-cache", action="store_true",
                        help="do not keep compiled programs in JAX's persistent cache "
                        "(default: kept under the cache dir's jax-compile/; also "
                        "MCFL_NO_COMPILE_CACHE=1)")


def add_overwrite_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace the {what} already in --out (default: refuse)")


def setup_compile_cache(args) -> None:
    """Turn JAX's persistent compilation cache on unless the flag or the environment say no;
    bench children learn it through the environment."""
    from mcfl import compile_cache

    if getattr(args, "no_compile_cache", False):
        os.environ[compile_cache.DISABLE_VARIABLE] = "1"
        return
    if args.command == "bench":
        return  # the parent runs no JAX; each child turns the cache on itself
    base = Path(args.cache_dir).expanduser() if getattr(args, "cache_dir", None) else None
    compile_cache.enable(None if base is None else base / compile_cache.SUBDIRECTORY)


def cache_dir_from_args(args) -> Optional[Path]:
    from mcfl.data.cache import default_cache_dir

    if args.no_cache:
        return None
    return Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()


def check_cache_dir(args) -> None:
    """--cache-dir names a folder that is, or can be made, writable (one line if not)."""
    if not getattr(args, "cache_dir", None):
        return
    path = Path(args.cache_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--cache-dir {args.cache_dir!r} is a file; name a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--cache-dir {args.cache_dir!r} cannot be made: "
                          f"{e.strerror or e}") from None


def config_from_args(args: argparse.Namespace, base: Optional[dict] = None) -> RunConfig:
    values: dict[str, Any] = dict(base or {})
    if getattr(args, "config", None):
        values.update(load_file(args.config))
    keys = all_keys()
    values.update({k: v for k, v in vars(args).items() if k in keys})
    return from_dict(values)


def _default_out(config: RunConfig) -> Path:
    return Path("runs") / (f"{config.algorithm}-{config.dataset}-c{config.clients or 'all'}"
                           f"-s{config.seed}")


def _progress_bar(total: int, desc: str):
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="round", dynamic_ncols=True)

    def update(r, row):
        shown = {"loss": f"{row['train_loss']:.3f}"}
        if "accuracy_micro" in row:
            shown["acc"] = f"{row['accuracy_micro']:.3f}"
            shown["acc_macro"] = f"{row['accuracy_macro']:.3f}"
        bar.set_postfix(shown, refresh=False)
        bar.update(1)

    return bar, update


def cmd_run(args) -> int:
    from mcfl import distributed
    from mcfl.runner import run

    multi_process = (args.coordinator is not None or args.num_processes is not None
                     or args.process_id is not None)
    if args.resume is not None:
        config, out = _resumed(args, multi_process)
    else:
        config = config_from_args(args)
        out = Path(args.out) if args.out else _default_out(config)
    if multi_process:
        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    if not distributed.is_leader():  # process 0 of a multi-process run reports and writes
        run(config, out_dir=None, cache_dir=cache_dir_from_args(args))
        return 0
    from mcfl.checkpoint import check_every

    check_every(args.checkpoint_every)
    if args.resume is None:
        from mcfl.apps.output import prepare_folder

        prepare_folder(out, args.overwrite)  # before the progress bar: a refusal is one line
    bar, update = _progress_bar(config.rounds, config.algorithm)
    announce = (_AllUsers(bar),) if config.clients is None else ()
    try:
        result = run(None if args.resume else config, out_dir=out, progress=update,
                     cache_dir=cache_dir_from_args(args), profile_dir=args.profile,
                     overwrite=args.overwrite, resume=args.resume,
                     checkpoint_every=args.checkpoint_every, observers=announce)
    except KeyboardInterrupt:
        bar.close()
        from mcfl import checkpoint

        again = (f"; continue it with: mcfl run --resume {out}" if checkpoint.exists(out)
                 else "")
        print(f"mcfl: interrupted; the rounds finished so far are in {out}/{again}",
              file=sys.stderr)
        return 130
    finally:
        bar.close()
    s = result.summary
    paper = s["paper_best_accuracy_micro"]
    best = (f"best {s['best_accuracy_micro']:.4f}" if config.score == "mcfl" else
            "paper score " + ("- (some client never joined a group)" if paper is None
                              else f"{paper:.4f}"))
    print(
        f"{config.algorithm}: accuracy micro {s['final_accuracy_micro']:.4f} "
        f"({best}), macro {s['final_accuracy_macro']:.4f}, "
        f"f1 micro {s['final_f1_micro']:.4f}; {s['seconds_per_round']:.3f} s/round; "
        f"results in {out}/"
    )
    return 0


class _AllUsers:
    """Says how many clients a natural dataset given no --clients brought (all its users)."""

    def __init__(self, bar):
        self._bar = bar

    def started(self, config, later_columns) -> None:
        self._bar.write(f"{config.dataset}: all {config.clients} users are clients "
                        "(--clients N keeps the first N)")

    def round(self, row) -> None: ...

    def stopped(self, summary) -> None: ...

    def finished(self, result) -> None: ...


def _resumed(args, multi_process: bool) -> tuple[RunConfig, Path]:
    """The config and folder of `mcfl run --resume DIR`: the run's own, from its checkpoint."""
    from mcfl import checkpoint
    from mcfl.config import from_dict

    given = sorted(k for k in vars(args) if k in all_keys()) + (
        ["config"] if args.config else [])
    if given:
        raise ConfigError("--resume continues a run with the config saved in its checkpoint; "
                          "drop " + ", ".join("--" + k.replace("_", "-") for k in given))
    if args.overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: pick one")
    if multi_process:
        raise ConfigError("--resume is for single-process runs (multi-process runs keep no "
                          "checkpoints)")
    out = Path(args.resume)
    if args.out is not None and Path(args.out).resolve() != out.resolve():
        raise ConfigError(f"a resumed run writes to its own folder {str(out)!r}; drop --out")
    return from_dict(checkpoint.latest(out).config), out


def cmd_sweep(args) -> int:
    from tqdm import tqdm

    from mcfl.sweeps import sweep
    from mcfl.sweeps.spec import parse_grid

    config = config_from_args(args)
    grid: dict[str, tuple] = {}
    if args.algorithms is not None:
        grid["algorithm"] = parse_grid(f"algorithm={args.algorithms}")[1]
    for text in args.grid or ():
        name, values = parse_grid(text)
        if name in grid:
            raise ConfigError(f"--grid {name} is given twice; list all its values in one flag")
        grid[name] = values
    out = Path(args.out)
    bars = []  # made at the first progress report, after every input was checked

    def update(done, total):
        if not bars:
            bars.append(tqdm(total=total, desc="sweep", unit="member-round",
                             dynamic_ncols=True))
        bars[0].n = done
        bars[0].refresh()

    try:
        result = sweep(config, seeds=args.seeds, grid=grid,
                       data_seeds=args.data_seeds, out_dir=out,
                       cache_dir=cache_dir_from_args(args),
                       members_per_chunk=args.members_per_chunk, progress=update,
                       overwrite=args.overwrite)
    finally:
        for bar in bars:
            bar.close()
    print(format_sweep_summary(result))
    groups = result.groups
    print(f"{len(result.members)} members in {len(groups)} group(s) "
          f"({', '.join(str(g['members_per_chunk']) for g in groups)} members per program); "
          f"{result.spec['wall_seconds']:.1f} s; results in {out}/")
    diverged = [m for m in result.members if m["status"] != "completed"]
    for m in diverged:
        print(f"mcfl: error: member {m['member']} (seed {m['seed']}"
              + "".join(f", {k}={m[k]}" for k in result.point_names)
              + f") diverged after round {m['rounds_completed']}; its rows so far are kept",
              file=sys.stderr)
    return 2 if diverged else 0


def format_sweep_summary(result) -> str:
    """Final micro accuracy (mean +/- std over seeds) of every grid point."""
    names = result.point_names
    lines = []
    for row in result.summary:
        label = ", ".join(f"{n}={row[n]}" for n in names) or "all members"
        mean = row.get("final_accuracy_micro_mean")
        std = row.get("final_accuracy_micro_std")
        shown = "-" if mean is None else f"{mean:.4f}" + (
            "" if std is None or std != std else f" +/- {std:.4f}")
        lines.append(f"{label:<40} accuracy micro {shown}  (n={row['completed']})")
    return "\n".join(lines)


def cmd_reproduce(args) -> int:
    from mcfl import reproduce

    if args.list:
        for table in reproduce.TABLES.values():
            quick = table.quick
            needs = f"; --data-dir: {table.data_layout}" if table.data_layout else ""
            print(f"{table.name}\n    {table.title}\n    full ({table.full.seeds} seeds"
                  f"{needs}): {table.full.cost}\n    --quick ({quick.note}; {quick.seeds} "
                  f"seed{'s' if quick.seeds > 1 else ''}): {quick.cost}")
        return 0
    if args.name is None:
        raise ConfigError("name a table to reproduce; allowed: "
                          + ", ".join(reproduce.names()) + " (mcfl reproduce --list)")
    reproduce.get(args.name)
    out = Path(args.out) if args.out else Path("runs") / "reproduce" / (
        args.name + ("-quick" if args.quick else ""))

    def show(label, i, count):
        print(f"[{i + 1}/{count}] {label}", flush=True)

    cells = None if args.cells is None else [c.strip() for c in args.cells.split(",")]
    reproduce.run_table(args.name, out, quick=args.quick, seeds=args.seeds,
                        cache_dir=cache_dir_from_args(args), progress=show,
                        overwrite=args.overwrite, cells=cells, data_dir=args.data_dir)
    print((out / "table.md").read_text())
    print(f"table.md, table.csv, table.png and each cell's sweep folder: {out}/")
    return 0


def cmd_data_describe(args) -> int:
    from mcfl.apps.describe import format_description
    from mcfl.data import load_dataset
    from mcfl.data.describe import describe

    dataset = load_dataset(config_from_args(args), cache_dir=cache_dir_from_args(args))
    summary = describe(dataset)
    print(json.dumps(summary, indent=2) if args.json else format_description(summary))
    return 0


def cmd_data_plot(args) -> int:
    from mcfl.apps.describe import plot_label_distribution
    from mcfl.apps.output import check_figure_path
    from mcfl.data import load_dataset

    out = check_figure_path(Path(args.out))
    dataset = load_dataset(config_from_args(args), cache_dir=cache_dir_from_args(args))
    print(f"label distribution: {plot_label_distribution(dataset, out)}")
    return 0


def cmd_compare(args) -> int:
    from mcfl.apps.compare import compare
    from mcfl.apps.output import check_figure_path

    print(compare([Path(r) for r in args.runs], check_figure_path(Path(args.out))))
    print(f"accuracy against communication: {args.out}")
    return 0


def cmd_plot_clusters(args) -> int:
    from mcfl.apps.plots import plot_clusters

    out = Path(args.out) if args.out else Path(args.run_dir) / "clusters.png"
    print(f"clients' local models in 2-D: {plot_clusters(Path(args.run_dir), out)}")
    return 0


def cmd_select_k(args) -> int:
    from mcfl.apps.select_k import write_select_k
    from mcfl.select_k import select_k

    config = config_from_args(args)
    candidates = _int_list(args.k, "--k")
    print(f"{'K':>3} {'acc micro':>10} {'acc macro':>10} {'intra dist':>11} {'seconds':>8}")

    def show(row):
        intra = row["intra_cluster_distance"]
        print(f"{row['k']:>3} {row['accuracy_micro']:>10.4f} {row['accuracy_macro']:>10.4f} "
              f"{'-' if intra is None else format(intra, '.4f'):>11} {row['seconds']:>8.1f}",
              flush=True)

    found = select_k(config, candidates, args.sample, args.candidate_rounds, args.tolerance,
                     progress=show)
    write_select_k(Path(args.out), found, config)
    print(f"recommended K = {found['recommended']} by accuracy (the smallest within "
          f"{args.tolerance} of the best), {found['elbow']} by the elbow of the intra-cluster "
          f"distance; {args.out}/select_k.csv, select_k.json, select_k.png")
    return 0


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ConfigError(f"{flag} must be comma-separated integers >= 1, got {text!r}")
    return values


def cmd_demo(args) -> int:
    from mcfl.apps.demo import run_demo

    run_demo(Path(args.out), rounds=args.rounds, clients=args.clients)
    return 0


def cmd_bench(args) -> int:
    from mcfl.apps import bench
    from mcfl.config import algorithm_names

    algorithms = bench.parse_names(args.algorithms, algorithm_names(), "algorithm")
    models = bench.parse_names(args.models, tuple(bench.FEATURES), "model")
    clients = bench.parse_counts(args.clients) if args.clients else bench.DEFAULT_CLIENTS
    for name in ("rounds", "clusters", "rows_per_client", "batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError(f"--timeout must be > 0 seconds, got {args.timeout}")
    points, skipped = bench.plan_points(
        algorithms, models, clients, clustering=args.clustering,
        max_mlp_clients=None if args.clients else bench.MLP_DEFAULT_MAX_CLIENTS,
        rounds=args.rounds, clusters=args.clusters, rows_per_client=args.rows_per_client,
        batch_size=args.batch_size, seed=args.seed, clients_per_round=args.clients_per_round,
        conv=args.conv,
    )
    out = Path(args.out)
    for line in skipped:
        print(f"skipped: {line}")
    print(f"{len(points)} points, each in its own process; results in {out}/bench.json")
    print(bench.TABLE_HEADER, flush=True)
    bench.run_sweep(points, out, args.timeout, skipped,
                    report=lambda record: print(bench.format_row(record), flush=True))
    print(f"plot: {out}/bench.png")
    return 0


def _add_bench_flags(parser: argparse.ArgumentParser) -> None:
    from mcfl.apps import bench

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
    parser.add_argument("--clients-per-round", type=_count_or_fraction, default=1.0,
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mcfl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

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
                       help="multi-process run: the address of process 0 (see README)")
    p_run.add_argument("--num-processes", type=int, metavar="N",
                       help="multi-process run: how many processes take part")
    p_run.add_argument("--process-id", type=int, metavar="I",
                       help="multi-process run: this process's rank, 0 .. N-1 (0 writes --out)")
    p_run.add_argument("--profile", metavar="DIR",
                       help="write a jax.profiler trace of rounds 2-3 to DIR (with "
                       "--scan-rounds: of the second chunk of rounds)")
    p_run.set_defaults(func=cmd_run)

    p_sweep = sub.add_parser(
        "sweep", help="many seeds and hyperparameter values as one vmapped program: "
        "mean / std tables and band plots")
    add_config_flags(p_sweep)
    add_cache_flags(p_sweep)
    add_compile_cache_flag(p_sweep)
    p_sweep.add_argument("--seeds", default="0", metavar="LIST",
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
    p_sweep.add_argument("--out", default="runs/sweep", metavar="DIR")
    add_overwrite_flag(p_sweep, "sweep")
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
    add_cache_flags(p_reproduce)
    add_compile_cache_flag(p_reproduce)
    p_reproduce.set_defaults(func=cmd_reproduce)

    p_data = sub.add_parser("data", help="inspect a federated dataset")
    data_sub = p_data.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    p_describe = data_sub.add_parser("describe", help="clients, samples and classes per client")
    p_plot = data_sub.add_parser("plot", help="PNG heat map of the labels of each client")
    for p in (p_describe, p_plot):
        add_config_flags(p, DATA_FLAGS)
        add_cache_flags(p)
    p_describe.add_argument("--json", action="store_true", help="print JSON")
    p_describe.set_defaults(func=cmd_data_describe)
    p_plot.add_argument("--out", default="label_distribution.png", metavar="PNG")
    p_plot.set_defaults(func=cmd_data_plot)

    p_compare = sub.add_parser("compare", help="table and accuracy-vs-communication plot of runs")
    p_compare.add_argument("--runs", nargs="+", required=True, metavar="DIR")
    p_compare.add_argument("--out", default="compare.png", metavar="PNG")
    p_compare.set_defaults(func=cmd_compare)

    p_plot_top = sub.add_parser("plot", help="plots of a run folder")
    plot_sub = p_plot_top.add_subparsers(dest="plot_command", required=True, parser_class=_Parser)
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
    p_select.add_argument("--sample", type=int, default=100,
                          help="clients sampled for the trials (default %(default)s)")
    p_select.add_argument("--candidate-rounds", type=int, default=3,
                          help="rounds per candidate (default %(default)s)")
    p_select.add_argument("--tolerance", type=float, default=0.005,
                          help="accuracy within which a smaller K is preferred (default "
                          "%(default)s)")
    p_select.add_argument("--out", default="runs/select-k", metavar="DIR")
    p_select.set_defaults(func=cmd_select_k)

    p_demo = sub.add_parser(
        "demo", help="baselines on Synthetic(1,1); FeSEM and IFCA on planted clusters"
    )
    p_demo.add_argument("--out", default="runs/demo", metavar="DIR")
    p_demo.add_argument("--rounds", type=int, default=None, help="override the demo's rounds")
    p_demo.add_argument("--clients", type=int, default=None, help="override the demo's clients")
    add_compile_cache_flag(p_demo)
    p_demo.set_defaults(func=cmd_demo)

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
    parser = build_parser()
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        check_cache_dir(args)
        if args.command in ("run", "sweep", "reproduce", "demo", "bench", "select-k"):
            setup_compile_cache(args)
        return args.func(args)
    except (McflError, ConfigError) as e:
        print(f"mcfl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mcfl: interrupted; rounds finished so far are in the output folder", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
