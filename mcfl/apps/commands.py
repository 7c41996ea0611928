"""What each `mcfl` subcommand does once its flags are parsed: call the library and print.
Bad input raises `McflError` / `ConfigError`, which `mcfl.apps.cli.main` prints in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mcfl import models, reproduce, tracking
from mcfl.apps import bench
from mcfl.apps.bench_point import FEATURES
from mcfl.apps.bench_suite import run_suite
from mcfl.apps.compare import compare
from mcfl.apps.demo import run_demo
from mcfl.apps.describe import format_description, plot_label_distribution
from mcfl.apps.flags import DATA_FLAGS, cache_dir_from_args, compile_cache_wanted, config_from_args
from mcfl.apps.plots import plot_clusters
from mcfl.apps.progress import progress_bar
from mcfl.apps.select_k import write_select_k
from mcfl.config import RunConfig, algorithm_names, all_keys, from_dict
from mcfl.data.describe import describe
from mcfl.data.export import export_dataset
from mcfl.errors import ConfigError, McflError
from mcfl.files import checkpoint, kinds
from mcfl.files.figures import check_figure_path
from mcfl.files.run_folder import SETTINGS_FILE, check_target
from mcfl.runs.plan import resolve
from mcfl.runs.resume import resume_settings
from mcfl.runs.runner import load_dataset, run
from mcfl.runs.select_k import select_k
from mcfl.runtime import distributed
from mcfl.settings import split_list
from mcfl.sweeps import sweep
from mcfl.sweeps.spec import parse_grid


def _default_out(config: RunConfig) -> Path:
    return Path("runs") / (f"{config.algorithm}-{config.dataset}-c{config.clients or 'all'}"
                           f"-s{config.seed}")


class _LazyBar:
    """A run's progress bar, shown from the run's start (`started`), so that nothing is
    printed before the run's inputs were checked."""

    def __init__(self, total: int, desc: str):
        self._total, self._desc = total, desc
        self._bar = None

    def started(self, config, later_columns) -> None:
        if self._bar is None:
            self._bar = progress_bar(total=self._total, desc=self._desc, unit="round",
                                     dynamic_ncols=True)  # (off unless on a terminal)

    def update(self, r, row) -> None:
        self.started(None, ())
        shown = {"loss": f"{row['train_loss']:.3f}"}
        if "accuracy_micro" in row:
            shown["acc"] = f"{row['accuracy_micro']:.3f}"
            shown["acc_macro"] = f"{row['accuracy_macro']:.3f}"
        if "dp_epsilon" in row:
            shown["eps"] = f"{row['dp_epsilon']:.3g}"
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(1)

    def write(self, text: str) -> None:
        self.started(None, ())
        self._bar.write(text)

    def round(self, row) -> None: ...

    def stopped(self, summary) -> None: ...

    def finished(self, result) -> None: ...

    def close(self, erase: bool = False) -> None:
        """Close the bar; `erase` clears it (an error follows in one line)."""
        if self._bar is not None:
            if erase:
                self._bar.leave = False
            self._bar.close()


def cmd_run(args) -> int:
    multi_process = (args.coordinator is not None or args.num_processes is not None
                     or args.process_id is not None)
    if args.resume is not None:
        config, out = _resumed(args, multi_process)
    else:
        config = config_from_args(args)
        out = Path(args.out) if args.out else _default_out(config)
        resolve(config, checkpoint_every=args.checkpoint_every)  # refused: nothing made yet
    # Checked in every process before any starts: a bad --log or a missing library, one line.
    trackers = tracking.from_specs(args.log)
    if multi_process:
        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    if not distributed.is_leader():  # process 0 of a multi-process run reports and writes
        run(config, out_dir=None, cache_dir=cache_dir_from_args(args))
        return 0
    checkpoint.check_every(args.checkpoint_every)
    if args.resume is None:
        check_target(out, args.overwrite)  # a refusal is one line, and makes no folder
    # The bar appears at the run's start, after its data were loaded and checked: an error
    # in them is one line on stderr.
    bar = _LazyBar(config.rounds, config.algorithm)
    announce = (_AllUsers(bar),) if config.clients is None else ()
    try:
        result = run(None if args.resume else config, out_dir=out, progress=bar.update,
                     cache_dir=cache_dir_from_args(args), profile_dir=args.profile,
                     overwrite=args.overwrite, resume=args.resume,
                     checkpoint_every=args.checkpoint_every,
                     observers=(bar, *announce, *trackers))
    except KeyboardInterrupt:
        bar.close()
        again = (f"; continue it with: mcfl run --resume {out}"
                 if (out / SETTINGS_FILE).exists() else "")
        print(f"mcfl: interrupted; the rounds finished so far are in {out}/{again}",
              file=sys.stderr)
        return 130
    except Exception:
        bar.close(erase=True)  # the error is one line
        raise
    finally:
        bar.close()
    s = result.summary
    paper = s["paper_best_accuracy_micro"]
    best = (f"best {s['best_accuracy_micro']:.4f}" if config.score == "mcfl" else
            "paper score " + ("- (some client never joined a group)" if paper is None
                              else f"{paper:.4f}"))
    private = ""
    if "dp_epsilon" in s:
        private = (f"; epsilon {s['dp_epsilon']:.4g} at delta {s['dp_delta']:.3g} "
                   f"({s['dp_accountant'].upper()}, z = {s['dp_noise']:.4g})")
    for note in s.get("notes", ()):
        print(f"mcfl: note: {note}", file=sys.stderr)
    print(
        f"{config.algorithm}: accuracy micro {s['final_accuracy_micro']:.4f} "
        f"({best}), macro {s['final_accuracy_macro']:.4f}, "
        f"f1 micro {s['final_f1_micro']:.4f}{private}; {s['seconds_per_round']:.3f} s/round; "
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
    _refuse_with_resume(args, (), "run")
    if multi_process:
        raise ConfigError("--resume is for single-process runs (multi-process runs keep no "
                          "checkpoints)")
    out = Path(args.resume)
    return from_dict(resume_settings(out)["config"]), out


def cmd_sweep(args) -> int:
    trackers = tracking.from_specs(args.log)  # a bad --log or a missing library: one line
    checkpoint.check_every(args.checkpoint_every)
    if args.resume is not None:
        _refuse_with_resume(args, ("seeds", "grid", "algorithms", "data_seeds",
                                   "members_per_chunk"), "sweep")
        config, grid, out = None, None, Path(args.resume)
        if kinds.folder_kind(out) == "sweep" and kinds.status(out, "sweep") == "completed":
            raise McflError(f"the sweep in {str(out)!r} completed; there is nothing to resume")
    else:
        config = config_from_args(args)
        grid = _sweep_grid(args)
        out = Path(args.out or "runs/sweep")
    bars = []  # made at the first progress report, after every input was checked

    def update(done, total):
        if not bars:
            bars.append(progress_bar(total=total, desc="sweep", unit="member-round",
                                     dynamic_ncols=True))
        bars[0].n = done
        bars[0].refresh()

    try:
        result = sweep(config, seeds=args.seeds or "0", grid=grid,
                       data_seeds=args.data_seeds, out_dir=out,
                       cache_dir=cache_dir_from_args(args),
                       members_per_chunk=args.members_per_chunk, progress=update,
                       overwrite=args.overwrite, observers=trackers, resume=args.resume,
                       checkpoint_every=args.checkpoint_every)
    except KeyboardInterrupt:
        for bar in bars:
            bar.close()
        print(f"mcfl: interrupted; the members finished so far are in {out}/; finish the "
              f"sweep with: mcfl sweep --resume {out}", file=sys.stderr)
        return 130
    finally:
        for bar in bars:
            bar.close()
    print(format_sweep_summary(result))
    groups = result.groups
    print(f"{len(result.members)} members in {len(groups)} group(s) "
          f"({', '.join(str(g.get('members_per_chunk')) for g in groups)} members per "
          f"program); {result.spec['wall_seconds']:.1f} s; results in {out}/")
    diverged = [m for m in result.members if m["status"] != "completed"]
    for m in diverged:
        print(f"mcfl: error: member {m['member']} (seed {m['seed']}"
              + "".join(f", {k}={m[k]}" for k in result.point_names)
              + f") diverged after round {m['rounds_completed']}; its rows so far are kept",
              file=sys.stderr)
    return 2 if diverged else 0


def _sweep_grid(args) -> dict[str, tuple]:
    grid: dict[str, tuple] = {}
    if args.algorithms is not None:
        grid["algorithm"] = parse_grid(f"algorithm={args.algorithms}")[1]
    for text in args.grid or ():
        name, values = parse_grid(text)
        if name in grid:
            raise ConfigError(f"--grid {name} is given twice; list all its values in one flag")
        grid[name] = values
    return grid


def _refuse_with_resume(args, flags: tuple[str, ...], what: str) -> None:
    """--resume continues a `what` (run, sweep, table) with the settings saved in its folder:
    any other setting (a config key, --config or one of `flags`), --overwrite and another
    --out are refused."""
    given = sorted(k for k, v in vars(args).items() if k in all_keys() and v is not None) + (
        ["config"] if getattr(args, "config", None) else [])
    given += [k for k in flags if getattr(args, k, None) not in (None, False) and k not in given]
    if given:
        raise ConfigError(f"--resume continues a {what} with the settings saved in its folder; "
                          "drop " + ", ".join("--" + k.replace("_", "-") for k in given))
    if getattr(args, "overwrite", False):
        raise ConfigError("--resume and --overwrite contradict each other: pick one")
    if getattr(args, "out", None) is not None and (
            Path(args.out).resolve() != Path(args.resume).resolve()):
        raise ConfigError(f"a resumed {what} writes to its own folder {args.resume!r}; drop "
                          "--out")


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
    if args.list:
        for table in reproduce.TABLES.values():
            quick = table.quick
            needs = f"; --data-dir: {table.data_layout}" if table.data_layout else ""
            print(f"{table.name}\n    {table.title}\n    full ({table.full.seeds} seeds"
                  f"{needs}): {table.full.cost}\n    --quick ({quick.note}; {quick.seeds} "
                  f"seed{'s' if quick.seeds > 1 else ''}): {quick.cost}")
        return 0
    if args.name is None and args.resume is None:
        raise ConfigError("name a table to reproduce; allowed: "
                          + ", ".join(reproduce.names()) + " (mcfl reproduce --list)")
    if args.resume is not None:
        _refuse_with_resume(args, ("name", "quick", "seeds", "cells", "data_dir"), "table")
        out = Path(args.resume)
    else:
        reproduce.get(args.name)
        out = Path(args.out) if args.out else Path("runs") / "reproduce" / (
            args.name + ("-quick" if args.quick else ""))

    def show(label, i, count):
        print(f"[{i + 1}/{count}] {label}", flush=True)

    cells = None if args.cells is None else split_list(args.cells, "--cells", "FedAvg,IFCA")
    try:
        reproduce.run_table(args.name, out if args.resume is None else None, quick=args.quick,
                            seeds=args.seeds, cache_dir=cache_dir_from_args(args),
                            progress=show, overwrite=args.overwrite, cells=cells,
                            data_dir=args.data_dir, resume=args.resume)
    except KeyboardInterrupt:
        print(f"mcfl: interrupted; the cells finished so far are in {out}/ (table.md says "
              f"which are missing); finish the table with: mcfl reproduce --resume {out}",
              file=sys.stderr)
        return 130
    print((out / "table.md").read_text())
    print(f"table.md, table.csv, table.png and each cell's sweep folder: {out}/")
    return 0


def cmd_data_describe(args) -> int:
    dataset = load_dataset(config_from_args(args), cache_dir=cache_dir_from_args(args))
    summary = describe(dataset)
    print(json.dumps(summary, indent=2) if args.json else format_description(summary))
    return 0


def cmd_data_export(args) -> int:
    config = config_from_args(args)
    dataset = load_dataset(config, cache_dir=cache_dir_from_args(args))
    settings = {name: getattr(config, name) for name in DATA_FLAGS}
    out = export_dataset(dataset, args.out, args.format, settings, overwrite=args.overwrite)
    print(f"{dataset.name}: {dataset.num_clients} clients, "
          f"{int(dataset.train_counts().sum())} train and {int(dataset.test_counts().sum())} "
          f"test rows written as {args.format} to {out}/")
    return 0


def cmd_data_plot(args) -> int:
    out = check_figure_path(Path(args.out))
    dataset = load_dataset(config_from_args(args), cache_dir=cache_dir_from_args(args))
    print(f"label distribution: {plot_label_distribution(dataset, out)}")
    return 0


def cmd_models(args) -> int:
    """The model registry: name, arguments with defaults, one line of description."""
    del args
    for name in models.names():
        arguments = models.registry.arguments(name)
        print(f"{name:18s} {models.registry.doc(name)}")
        if arguments:
            print(f"{'':18s} model_args: {arguments}")
    return 0


def cmd_compare(args) -> int:
    print(compare([Path(r) for r in args.runs], check_figure_path(Path(args.out)), args.x))
    against = {"comm": "communication", "sim_time": "simulated time", "round": "rounds"}
    print(f"accuracy against {against[args.x]}: {args.out}")
    return 0


def cmd_plot_clusters(args) -> int:
    out = Path(args.out) if args.out else Path(args.run_dir) / "clusters.png"
    print(f"clients' local models in 2-D: {plot_clusters(Path(args.run_dir), out)}")
    return 0


def cmd_select_k(args) -> int:
    config = config_from_args(args)
    candidates = _int_list(args.k, "--k")
    check_target(Path(args.out), True, "select-k")  # (its files are rewritten; no other kind's)
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
    items = split_list(text, flag)  # (an empty item or a repeated K: its own message)
    try:
        values = [int(v) for v in items]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ConfigError(f"{flag} must be comma-separated integers >= 1, got {text!r}")
    return values


def cmd_demo(args) -> int:
    run_demo(Path(args.out), rounds=args.rounds, clients=args.clients)
    return 0


def cmd_bench(args) -> int:
    if args.suite is not None:
        return _bench_suite(args)
    if args.tiny or args.only or args.data_dir:
        raise ConfigError("--tiny, --only and --data-dir go with --suite accelerator")
    algorithms = bench.parse_names(args.algorithms, algorithm_names(), "algorithm")
    models = bench.parse_names(args.models, tuple(FEATURES), "model")
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
    check_target(out, True, "bench")  # (bench.json is rewritten; no other kind's files)
    for line in skipped:
        print(f"skipped: {line}")
    print(f"{len(points)} points, each in its own process; results in {out}/bench.json")
    print(bench.TABLE_HEADER, flush=True)
    bench.run_sweep(points, out, args.timeout, skipped,
                    report=lambda record: print(bench.format_row(record), flush=True),
                    compile_cache=compile_cache_wanted(args))
    print(f"plot: {out}/bench.png")
    return 0


def _bench_suite(args) -> int:
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError(f"--timeout must be > 0 seconds, got {args.timeout}")
    only = tuple(split_list(args.only, "--only", "cnn,table")) if args.only else ()
    out = Path(args.out)
    check_target(out, True, "bench")
    where = "in this process" if args.tiny else "each in its own process"
    print(f"suite {args.suite}{' (tiny)' if args.tiny else ''}: workloads {where}; results in "
          f"{out}/bench.json and {out}/summary.md", flush=True)

    def report(record: dict) -> None:
        took = record.get("seconds_per_round")
        status = ("ok" if record["status"] == "ok" else f"FAILED: {record.get('error')}")
        print(f"{record['label']:<24} {'' if took is None else f'{took:.4f} s/round':<16} "
              f"{status}", flush=True)

    run_suite(out, args.tiny, only, args.timeout, report, args.data_dir,
              compile_cache_wanted(args))
    print(f"summary: {out}/summary.md")
    return 0
