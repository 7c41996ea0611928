"""`mcfl plan`: what a run needs (work, memory, sizes) and, for each named machine, whether it
fits and the least time a round and the run can take there (`mcfl.planning.estimate`),
without training.

The data are sized from the config before anything is built (`mcfl.runtime.memory.data_fit`,
the figure `mcfl run` refuses with): a run whose data cannot fit here gets that estimate, the
memory here and on each target, and the refusal `mcfl run` gives (exit code 2), in a second
instead of an out-of-memory error after a long build.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Optional

import jax

from mcfl.apps.flags import cache_dir_from_args, config_from_args
from mcfl.config import RunConfig
from mcfl.errors import McflError, choice_error
from mcfl.planning import tpu_compile
from mcfl.planning.estimate import RunEstimate, TargetBound, bound_on, estimate_run
from mcfl.planning.targets import CPU_HERE, DEFAULT, NAMES, TARGETS, Target, measure_cpu
from mcfl.runs.plan import resolve
from mcfl.runtime import memory
from mcfl.settings import split_list


def parse_targets(text: Optional[Sequence[str]]) -> tuple[str, ...]:
    """`--target` values (repeated or comma-separated; 'all') -> target names, checked."""
    if not text:
        return DEFAULT
    names: list[str] = []
    for item in text:
        for name in split_list(item, "--target", "t4"):
            if name == "all":
                names.extend(NAMES)
            elif name not in NAMES:
                raise choice_error("target", name, NAMES + ("all",))
            else:
                names.append(name)
    return tuple(dict.fromkeys(names))


def targets_of(names: Sequence[str]) -> list[Target]:
    return [measure_cpu(memory.host_available()) if name == CPU_HERE else TARGETS[name]
            for name in names]


def cmd_plan(args) -> int:
    names = parse_targets(args.target)
    config = config_from_args(args)
    start = time.perf_counter()
    resolved = resolve(config)  # a setting that does not apply: refused before anything
    fit = memory.data_fit(resolved.data)
    if fit is not None and not fit.fits:  # nothing is built: the data's estimate is the plan
        seconds = time.perf_counter() - start
        if args.json:
            print(json.dumps(unfit_document(config, fit, names, seconds), indent=1))
        else:
            print(format_unfit(config, fit, names, seconds))
        raise McflError(fit.problem)  # as `mcfl run` refuses it: one line, exit code 2
    tpu_targets, tpu_note = compiled_targets(names)
    estimate = estimate_run(config, cache_dir=cache_dir_from_args(args),
                            tpu_targets=tpu_targets)
    bounds = [bound_on(estimate, t, estimate.config.precision) for t in targets_of(names)]
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps(plan_document(estimate, bounds, seconds, tpu_note), indent=1))
    else:
        print(format_plan(estimate, bounds, seconds, tpu_note))
    return 0


def compiled_targets(names: Sequence[str]) -> tuple[tuple[str, ...], Optional[str]]:
    """(the TPU targets among `names` the TPU compiler will compile for, a note when there are
    TPU targets it cannot: the extra is not installed)."""
    tpus = tuple(name for name in names if name in tpu_compile.TOPOLOGIES)
    reason = tpu_compile.missing() if tpus else None
    if reason is None:
        return tpus, None
    return (), (f"TPU targets ({', '.join(tpus)}): estimated from this machine's programs and "
                f"the datasheet, not compiled; {reason}")


def data_targets(fit: memory.DataFit, names: Sequence[str]
                 ) -> list[tuple[Optional[Target], int, float]]:
    """(target (None: cpu-here), bytes its data need per device, bytes it has) for a run not
    planned further: on this machine's CPU the rows and the generator's temporaries share the
    host's available memory; an accelerator holds the rows on each device (`bound_on`)."""
    out = []
    for name in names:
        if name == CPU_HERE:  # (its memory, without timing its arithmetic: nothing will run)
            out.append((None, fit.need.host + fit.need.device, fit.host_available))
        else:
            out.append((TARGETS[name], fit.need.device, TARGETS[name].memory))
    return out


def format_unfit(config: RunConfig, fit: memory.DataFit, names: Sequence[str],
                 seconds: float) -> str:
    """The plan of a run whose data cannot be built here: their size, from the config, against
    the memory here and on each target."""
    clients = "all" if config.clients is None else f"{config.clients:,}"
    here = (f"{_size(fit.host)} of host memory, {_size(fit.host_available)} available "
            "(the CPU backend keeps the rows there too)" if memory.on_host() else
            f"{_size(fit.host)} of host memory ({_size(fit.host_available)} available) and "
            f"{_size(fit.device)} of device memory ({_size(fit.device_available)} available)")
    lines = [
        f"{config.algorithm} on {config.dataset}: {clients} clients, {config.rounds} rounds; "
        f"model {config.model}",
        f"data (estimated from the config; nothing was built): {_size(fit.need.device)} on "
        f"the device, {_size(fit.need.host)} more on the host while they are made",
        f"here ({jax.default_backend()}): needs {here}: does NOT fit",
        "",
        f"{'target':<10} {'devices':>7} {'data/device':>12} {'has':>9} {'fits':>4}",
    ]
    for target, need, has in data_targets(fit, names):
        name, devices = (CPU_HERE, 1) if target is None else (target.name, target.devices)
        lines.append(f"{name:<10} {devices:>7} {_size(need):>12} {_size(has):>9} "
                     f"{'yes' if need <= has else 'NO':>4}")
    lines += [
        "(the data alone: a run also needs its state and its programs' temporaries, which "
        "mcfl plan counts once the data fit here)",
        f"planned in {seconds:.1f} s",
    ]
    return "\n".join(lines)


def unfit_document(config: RunConfig, fit: memory.DataFit, names: Sequence[str],
                   seconds: float) -> dict:
    """`mcfl plan --json` of a run whose data cannot be built here."""
    targets = {}
    for target, need, has in data_targets(fit, names):
        targets[CPU_HERE if target is None else target.name] = {
            "devices": 1 if target is None else target.devices, "need_bytes": need,
            "memory_bytes": has, "fits": need <= has,
            "source": "this machine's available memory" if target is None else target.source}
    return {
        "config": config.to_dict(), "dataset": config.dataset, "clients": config.clients,
        "data_bytes": fit.need.device, "data_host_bytes": fit.need.host,
        "here": {"backend": jax.default_backend(), "host_bytes": fit.host,
                 "host_available_bytes": fit.host_available, "device_bytes": fit.device,
                 "device_available_bytes": fit.device_available, "fits": False},
        "targets": targets, "error": fit.problem, "plan_seconds": seconds,
    }


def _size(n: Optional[float]) -> str:
    if n is None:
        return "?"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _count(n: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


def _time(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    if s >= 60:
        return f"{s / 60:.3g} min"
    if s >= 1:
        return f"{s:.3g} s"
    return f"{s * 1e3:.3g} ms"


def format_plan(estimate: RunEstimate, bounds: Sequence[TargetBound], seconds: float,
                tpu_note: Optional[str] = None) -> str:
    c = estimate.config
    lines = [
        f"{c.algorithm} on {estimate.dataset}: {estimate.clients:,} clients, "
        f"{estimate.clients_per_round:,} a round, {c.rounds} rounds; model {c.model} "
        f"({estimate.params:,} parameters)",
        f"data {_size(estimate.data_bytes)}, run state {_size(estimate.state_bytes)}, "
        f"client store {estimate.store} ({_size(estimate.stored_bytes)} stored)",
        *_privacy_lines(estimate.privacy),
        "",
        f"{'program':<9} {'calls':>6} {'FLOPs':>9} {'of which matmul':>15} {'bytes moved':>11} "
        f"{'XLA FLOPs':>9} {'memory here':>11}",
    ]
    for p in estimate.programs:
        xla = _count(p.xla["flops"]) if "flops" in p.xla else "-"
        lines.append(f"{p.name:<9} {p.calls:>6,} {_count(p.cost.flops):>9} "
                     f"{_count(p.cost.matmul_flops):>15} {_size(p.cost.bytes):>11} {xla:>9} "
                     f"{_size(p.footprint):>11}")
    run = estimate.run_cost
    lines.append(f"{'run':<9} {'':>6} {_count(run.flops):>9} {_count(run.matmul_flops):>15} "
                 f"{_size(run.bytes):>11}")
    loops = max(p.cost.while_loops for p in estimate.programs)
    occasional = estimate.program("round").cost.occasional
    lines += [
        "(FLOPs and bytes per call, counted on the programs with every loop run as often as it "
        "runs; XLA's own analysis counts each loop body once."
        + (f" {loops} data-dependent loop(s) counted once." if loops else "")
        + (f" The round's {occasional} occasional branch(es) (work done only in some rounds: "
           "newcomers, migrations, splits ...) counted at their cheaper side; 'with it': a "
           "round that does that work." if occasional else "") + ")",
        f"memory here: XLA's memory analysis on {estimate.backend}",
        "",
        f"{'target':<10} {'devices':>7} {'needs/device':>12} {'has':>9} {'fits':>4} "
        f"{'round >=':>9} {'run >=':>9}  bound by"
        + (f"  {'with it >=':>10}" if occasional else ""),
    ]
    for b in bounds:
        fits = "?" if b.fits is None else ("yes" if b.fits else "NO")
        with_it = "" if b.occasional_round_seconds is None else \
            f"  {_time(b.occasional_round_seconds):>10}"
        has = b.target.memory if b.compiled is None else b.compiled.hbm_bytes
        lines.append(f"{b.target.name:<10} {b.target.devices:>7} "
                     f"{_size(b.need_bytes):>12} {_size(has):>9} {fits:>4} "
                     f"{_time(b.round_seconds):>9} {_time(b.run_seconds):>9}  "
                     + (f"{b.limit:<8}{with_it}" if with_it else b.limit)
                     + ("" if b.compiled is None else "  (TPU compiler)"))
    lines.append("(times: roofline lower bounds, the larger of FLOPs at peak and bytes at "
                 "bandwidth; BENCHMARKS.md says how far measured rounds were above them)")
    compiled = [b for b in bounds if b.compiled is not None]
    if compiled:
        lines += ["(TPU compiler: the run compiled for that TPU by its own compiler; memory per "
                  "device, fit and HBM are its figures, the times from its per-device cost "
                  "analysis, which counts each loop body once, with mcfl's count of the loops' "
                  "further passes)", ""]
        for b in compiled:
            lines += _compiled_lines(b)
    if tpu_note:
        lines.append(tpu_note)
    if estimate.resolved is not None:
        lines += ["", *resolved_lines(estimate.resolved)]
    lines.append(f"planned in {seconds:.1f} s")
    return "\n".join(lines)


def resolved_lines(resolved: dict) -> list[str]:
    """The resolved plan (`mcfl.runs.plan.Plan.describe`), a part a line: what every setting
    came to, defaults filled in (what run.json's "plan" records)."""
    lines = ["the resolved plan (every default filled in; run.json records it as \"plan\"):"]

    def flat(value, prefix=""):
        if isinstance(value, dict):
            for key, item in value.items():
                yield from flat(item, f"{prefix}{key}.")
        elif value is not None:
            yield f"{prefix[:-1]}={value}"

    for part, value in resolved.items():
        if part == "notes":
            lines += [f"  note: {note}" for note in value]
        elif isinstance(value, dict):
            lines.append(f"  {part:<14} " + " ".join(flat(value)))
        else:
            lines.append(f"  {part:<14} {'-' if value is None else value}")
    return lines


def _compiled_lines(bound: TargetBound) -> list[str]:
    """One TPU target's compiled programs: memory per device by kind, padding, work, fusions."""
    c = bound.compiled
    lines = [f"{c.target}: {c.devices} x {c.device_kind}, compiled by libtpu {c.libtpu} in "
             f"{c.seconds:.1f} s; HBM a device's buffers may use: {_size(c.hbm_bytes)} (the "
             f"compiler's figure; datasheet {_size(bound.target.memory)}: "
             f"{bound.target.source}); client store {c.store}"]
    if c.programs:
        lines.append(f"  {'program':<12} {'calls':>6} {'arguments':>9} {'outputs':>9} "
                     f"{'temps':>9} {'code':>8} {'total':>9} {'padding':>8} {'FLOPs':>8} "
                     f"{'fusions':>7}")
    for p in c.programs:
        lines.append(f"  {p.name:<12} {p.calls:>6,.0f} {_size(p.argument_bytes):>9} "
                     f"{_size(p.output_bytes):>9} {_size(p.temp_bytes):>9} "
                     f"{_size(p.code_bytes):>8} {_size(p.need_bytes):>9} "
                     f"{_size(p.padding_bytes):>8} {_count(p.per_device().flops):>8} "
                     f"{p.fusions:>7}")
    if c.refused is not None:
        lines.append(f"  does NOT fit: the TPU compiler refused {c.refused.name}: "
                     f"{c.refused.message}")
    elif not c.fits:
        lines.append(f"  does NOT fit: {_size(c.need_bytes)} a device against "
                     f"{_size(c.hbm_bytes)}")
    lines.append("  (per device; padding: what the TPU's 8 x 128 tiles add to arguments and "
                 "outputs; FLOPs: one call's, the compiler's with mcfl's count of the loops' "
                 "further passes)")
    return lines


def _privacy_lines(privacy: Optional[dict]) -> list[str]:
    """What a DP run will spend, before it runs."""
    if privacy is None:
        return []
    budget = ""
    if privacy["dp_epsilon_budget"] is not None:
        budget = (f"; the budget {privacy['dp_epsilon_budget']:g} stops it after round "
                  f"{privacy['dp_rounds_within_budget']}")
    return [f"privacy: epsilon {privacy['dp_epsilon']:.4g} at delta {privacy['dp_delta']:.3g} "
            f"after {privacy['dp_rounds_within_budget']} rounds{budget} (noise multiplier "
            f"{privacy['dp_noise']:.4g}, clip {privacy['dp_clip']:g}); "
            f"{privacy['dp_accounting']}"]


def compiled_document(compiled) -> dict:
    """A `CompiledRun` for `mcfl plan --json`."""
    return {
        "device_kind": compiled.device_kind, "devices": compiled.devices,
        "hbm_bytes": compiled.hbm_bytes, "need_bytes": compiled.need_bytes,
        "fits": compiled.fits, "store": compiled.store, "libtpu": compiled.libtpu,
        "compile_seconds": compiled.seconds,
        "refused": None if compiled.refused is None else compiled.refused._asdict(),
        "programs": {p.name: {"kind": p.kind, "calls": p.calls,
                              "argument_bytes": p.argument_bytes,
                              "output_bytes": p.output_bytes, "temp_bytes": p.temp_bytes,
                              "alias_bytes": p.alias_bytes, "code_bytes": p.code_bytes,
                              "need_bytes": p.need_bytes, "logical_bytes": p.logical_bytes,
                              "padding_bytes": p.padding_bytes, "xla_flops": p.flops,
                              "xla_bytes_accessed": p.bytes_accessed, "fusions": p.fusions,
                              "per_device": p.per_device()._asdict(),
                              "compile_seconds": p.seconds}
                     for p in compiled.programs},
    }


def plan_document(estimate: RunEstimate, bounds: Sequence[TargetBound], seconds: float,
                  tpu_note: Optional[str] = None) -> dict:
    """`mcfl plan --json`: the same figures, machine-readable."""
    return {
        "config": estimate.config.to_dict(),
        "dataset": estimate.dataset, "params": estimate.params, "clients": estimate.clients,
        "clients_per_round": estimate.clients_per_round, "data_bytes": estimate.data_bytes,
        "state_bytes": estimate.state_bytes, "store": estimate.store,
        "stored_bytes": estimate.stored_bytes, "backend": estimate.backend,
        "programs": {p.name: {"calls": p.calls, **p.cost._asdict(), "xla": p.xla,
                              "footprint_bytes": p.footprint} for p in estimate.programs},
        "occasional_round": (None if estimate.occasional_round is None
                             else estimate.occasional_round._asdict()),
        "targets": {b.target.name: {"devices": b.target.devices, "need_bytes": b.need_bytes,
                                    "memory_bytes": b.target.memory, "fits": b.fits,
                                    "round_seconds": b.round_seconds,
                                    "run_seconds": b.run_seconds, "bound_by": b.limit,
                                    "occasional_round_seconds": b.occasional_round_seconds,
                                    "source": b.target.source,
                                    "compiled": (None if b.compiled is None
                                                 else compiled_document(b.compiled))}
                    for b in bounds},
        "tpu_note": tpu_note,
        "privacy": estimate.privacy,
        "plan": estimate.resolved,
        "plan_seconds": seconds,
    }
