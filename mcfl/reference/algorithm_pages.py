"""One documentation page per registered algorithm, written from the registry.

Everything on a page is read from the code a run uses, so the page cannot drift from it: the
registration (name, one-line summary, paper, clustered or asynchronous), the algorithm module's
docstring (what the paper's round is, its equations, its defaults against the paper), the
hyperparameter dataclass (flag, default, allowed values, whether a sweep varies it inside one
compiled program), what the built algorithm keeps per client (which client store holds it),
and `mcfl.privacy.support` (whether client-level DP covers its round, and if not, why).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import textwrap

from mcfl import settings
from mcfl.algorithms.framework import registry
from mcfl.algorithms.framework.registry import AlgorithmSpec
from mcfl.config import from_dict
from mcfl.privacy import support


def page_path(name: str) -> str:
    """Where algorithm `name`'s page lives in the site."""
    return f"algorithms/{name}.md"


def kept_per_client(spec: AlgorithmSpec) -> str:
    """What `spec`'s algorithm keeps per client: "rows", "start" or "nothing"
    (`AlgorithmSpec.keeps`)."""
    return spec.keeps


_STORE_TEXT = {
    "rows": ("It keeps a row of state for every client (personal models, control variates or "
             "its components' weights). The rows live where `--client-store` puts them: on "
             "the device, in host memory or on disk, read and written one round at a time; "
             "`auto` chooses by their size ([client store](../guide/client-store.md))."),
    "start": ("Its start trains every client once and clusters the trained models. Those "
              "models are what a client store holds: with `--client-store host` or `disk` "
              "the start is streamed through them ([client store](../guide/client-store.md))."),
    "nothing": ("It keeps nothing per client between rounds: its state is the server's "
                "models, so `--client-store` has nothing to hold."),
}


def privacy_text(name: str) -> str:
    """Whether client-level DP (`--dp-clip` with `--dp-noise` or `--dp-epsilon`) covers
    algorithm `name`'s round, how, or why not."""
    if name in support.COVERED:
        covered = support.COVERED[name]
        parts = [f"Client-level DP covers its round: {covered.sums} noised "
                 f"sum{'s' if covered.sums > 1 else ''} of clipped messages a round"]
        if covered.noised_counts:
            parts.append("the per-cluster client counts released with noise")
        parts.append("adaptive clipping (`--dp-adaptive-quantile`) available" if covered.adaptive
                     else "a fixed clipping norm (no `--dp-adaptive-quantile`)")
        if name in support.CANARY_ALGORITHMS:
            parts.append("`--dp-canaries` can audit it")
        return "; ".join(parts) + " ([privacy](../guide/privacy.md))."
    reason = support.REFUSED.get(name, "it is not one mcfl's DP covers")
    return f"Client-level DP does not apply: {reason}."


def participation_text(spec: AlgorithmSpec) -> str:
    """Which participation options apply to `spec`'s algorithm."""
    if spec.asynchronous:
        return ("Asynchronous: its server steps on the simulated clock as clients finish, so "
                "`--deadline` and `--over-select` do not apply; device speeds, bandwidth, "
                "availability and dropouts do ([clients as they are](../guide/clients.md)).")
    poisson = "and `--client-sampling poisson`" if spec.name in support.COVERED else (
        "(not `--client-sampling poisson`, which is for DP's accounting)")
    return ("Partial participation with `--clients-per-round`, random or round-robin sampling "
            f"{poisson}; device speeds, dropouts, deadlines, over-selection and availability "
            "([clients as they are](../guide/clients.md)).")


def hyperparameter_table(spec: AlgorithmSpec) -> str:
    """Markdown table of `spec`'s hyperparameters: flag, default, allowed values, whether a
    sweep runs its values as one program, and its doc."""
    fields = dataclasses.fields(spec.params)
    if not fields:
        return "None of its own: it takes the run's settings ([running](../guide/running.md))."
    lines = ["| flag / key | default | allowed | in a sweep | what it is |",
             "| --- | --- | --- | --- | --- |"]
    for field in fields:
        key = settings.key_of(field)
        traced = settings.is_traced(spec.params, field)
        sweep = "one program (traced)" if traced else "a program per value"
        lines.append(f"| {settings.flag_text(key, isinstance(field.default, bool))} / `{key}` "
                     f"| {_default(field.default)} | "
                     f"{settings.allowed(spec.params, field)} | {sweep} | "
                     f"{_cell(settings.doc_of(field))} |")
    return "\n".join(lines)


def algorithm_page(name: str) -> str:
    """The markdown page of registered algorithm `name`."""
    spec = registry.get(name)
    module = importlib.import_module(spec.factory.__module__)
    kind = ("asynchronous" if spec.asynchronous else
            "clustered (K = `--clusters`)" if spec.clustered else "one model or personal models")
    factory_doc = inspect.getdoc(spec.factory) or ""
    source = module.__name__.replace(".", "/") + ".py"
    example_flags = " --clusters 4" if spec.clustered else ""
    # the page's example is a valid config (a bad one fails the docs build)
    from_dict({"algorithm": name, "dataset": "synthetic", "rounds": 20,
               **({"clusters": 4} if spec.clustered else {})})
    sections = [
        f"# `{name}`",
        "",
        f"{spec.summary[:1].upper()}{spec.summary[1:]}.",
        "",
        f"- **Paper:** {spec.reference}",
        f"- **Kind:** {kind}",
        f"- **Source:** `{source}` (`{spec.factory.__module__}.{spec.factory.__name__}`)",
        "",
        "```bash",
        f"mcfl run --algorithm {name}{example_flags} --dataset synthetic --rounds 20",
        "```",
        "",
        "```python",
        f'result = mcfl.run(mcfl.RunConfig(algorithm="{name}", dataset="synthetic", '
        f"rounds=20{', clusters=4' if spec.clustered else ''}))",
        "```",
        "",
        "## What it does",
        "",
        _as_markdown(module.__doc__ or ""),
    ]
    if factory_doc and factory_doc not in (module.__doc__ or ""):
        sections += ["", _as_markdown(factory_doc)]
    sections += [
        "",
        "## Hyperparameters",
        "",
        hyperparameter_table(spec),
        "",
        "## Client store",
        "",
        _STORE_TEXT[kept_per_client(spec)],
        "",
        "## Privacy and participation",
        "",
        "- " + privacy_text(name),
        "- " + participation_text(spec),
        "",
    ]
    return "\n".join(sections)


def _as_markdown(docstring: str) -> str:
    """A docstring as markdown: its paragraphs as they are, except those laid out by
    indentation (a round's steps, a formula set off), which keep their layout in a text
    block; reST's ``literal`` becomes a code span."""
    paragraphs = textwrap.dedent(docstring).strip("\n").split("\n\n")
    out = []
    for paragraph in paragraphs:
        lines = paragraph.split("\n")
        if any(line.startswith("  ") for line in lines[1:]) or lines[0].startswith("  "):
            out.append("```text\n" + paragraph + "\n```")
        else:
            out.append(paragraph.replace("``", "`"))
    return "\n\n".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value) -> str:
    """A default in the table: on / off as words, other values as code, None as unset."""
    if value is None:
        return "unset"
    return settings.shown(value) if isinstance(value, bool) else f"`{settings.shown(value)}`"
