"""The site's generated pages (run by mkdocs-gen-files when the site is built).

Written from the installed package, so they cannot drift from it: the home page (the
README, links turned into the site's), the command line (from the parser), one page per
registered algorithm (from the registry), the partition recipes' pictures, the benchmark and
reproduction records (BENCHMARKS.md, REPRODUCTION.md), the notebooks with their stored
outputs, and the navigation (SUMMARY.md, read by mkdocs-literate-nav). Public names of the API
pages without a docstring are logged as warnings, which `mkdocs build --strict` turns into a
failed build.
"""

from __future__ import annotations

import logging
from pathlib import Path

import mkdocs_gen_files

import mcfl
from mcfl.algorithms.framework import registry
from mcfl.reference.algorithm_pages import algorithm_page, page_path
from mcfl.reference.api_check import undocumented_public_names
from mcfl.reference.cli_page import cli_page
from mcfl.reference.partition_pictures import RECIPES, draw, file_name, partitions_page
from mcfl.reference.site_links import INCLUDED, with_site_links

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ("quickstart", "reproduce")
log = logging.getLogger("mkdocs.plugins.mcfl")

def write(path: str, text: str) -> None:
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(text)


def included_pages() -> None:
    for source, page in INCLUDED.items():
        text = (ROOT / source).read_text()
        write(page, with_site_links(text, page))


def algorithm_pages() -> list[str]:
    """A page per registered algorithm, and the overview's table linked to them."""
    names = list(registry.names())
    for name in names:
        write(page_path(name), algorithm_page(name))
    overview = (ROOT / "docs" / "algorithms" / "index.md").read_text()
    before, rest = overview.split("<!-- algorithms:start -->\n")
    _, after = rest.split("\n<!-- algorithms:end -->")
    linked = registry.markdown_table(link=lambda name: f"{name}.md")
    write("algorithms/index.md", f"{before}{linked}{after}")
    return names


def partition_pictures() -> None:
    for recipe in RECIPES:
        with mkdocs_gen_files.open(f"images/partitions/{file_name(recipe.partition)}", "wb") as f:
            draw(recipe, f)
    write("guide/partitions.md", partitions_page("../images/partitions"))


def notebooks() -> None:
    for name in NOTEBOOKS:
        with mkdocs_gen_files.open(f"notebooks/{name}.ipynb", "wb") as f:
            f.write((ROOT / "notebooks" / f"{name}.ipynb").read_bytes())


SUMMARY = """\
* [Home](index.md)
* [Getting started](getting-started.md)
* Guide
    * [Running experiments](guide/running.md)
    * [The Python API](guide/python-api.md)
    * [Sweeps](guide/sweeps.md)
    * [Datasets and partitions](guide/datasets.md)
    * [Partition recipes, drawn](guide/partitions.md)
    * [Your own model](guide/models.md)
    * [Message transforms](guide/transforms.md)
    * [Client-level differential privacy](guide/privacy.md)
    * [Clients as they are](guide/clients.md)
    * [The client store](guide/client-store.md)
    * [Watching runs](guide/tracking.md)
* [Command line](cli.md)
* Algorithms
    * [Overview](algorithms/index.md)
{algorithms}
* Python API
    * [mcfl](api/run.md)
    * [mcfl.algorithms](api/algorithms.md)
    * [mcfl.data](api/data.md)
    * [mcfl.models](api/models.md)
    * [mcfl.transforms](api/transforms.md)
    * [mcfl.tracking](api/tracking.md)
* [Accelerators](accelerators.md)
* [Reproducing the papers](reproducing.md)
* [Benchmarking](benchmarking.md)
* Results
    * [Benchmarks](results/benchmarks.md)
    * [Reproduction](results/reproduction.md)
* Notebooks
    * [Quick start](notebooks/quickstart.ipynb)
    * [Reproducing a table](notebooks/reproduce.ipynb)
* [Adding an algorithm, model or dataset](extending.md)
* [Architecture](architecture.md)
* [Tests](testing.md)
"""


def main() -> None:
    included_pages()
    write("cli.md", cli_page())
    names = algorithm_pages()
    partition_pictures()
    notebooks()
    entries = "\n".join(f"    * [{name}]({page_path(name)})" for name in names)
    write("SUMMARY.md", SUMMARY.format(algorithms=entries))
    for name in undocumented_public_names():
        log.warning("public name without a docstring: %s", name)
    log.info("mcfl %s: %d algorithm pages", mcfl.__version__, len(names))


main()
