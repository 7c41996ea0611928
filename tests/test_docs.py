"""The documentation: the site builds with `mkdocs build --strict` from the installed package,
with a page per registered algorithm; its generated pieces say what the code does; the README
stays short and its commands and Python run."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mcfl import settings
from mcfl.algorithms.framework import registry
from mcfl.apps.cli import build_parser, main
from mcfl.reference import algorithm_pages, api_check, cli_page, site_links
from mcfl.reference.partition_pictures import RECIPES, file_name

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once with --strict into a temporary folder (about 25 s)."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", DISABLE_MKDOCS_2_WARNING="true")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_site_has_a_page_per_registered_algorithm(site):
    pages = {p.name for p in (site / "algorithms").iterdir() if (p / "index.html").exists()}
    assert pages == set(registry.names())
    overview = (site / "algorithms" / "index.html").read_text()
    for name in registry.names():  # the overview's table links every page
        assert f'href="{name}/"' in overview, name
    fesem = (site / "algorithms" / "fesem" / "index.html").read_text()
    assert "Eq. 9" in fesem and "fesem_restarts" in fesem  # the docstring and the table


def test_the_site_has_every_page_of_its_navigation(site):
    assert "What it does beyond its peers" in (site / "index.html").read_text()  # the README
    for page in ("getting-started", "cli", "guide/partitions", "api/run",
                 "results/benchmarks", "results/reproduction", "notebooks/quickstart",
                 "notebooks/reproduce", "architecture", "accelerators", "extending"):
        assert (site / page / "index.html").exists(), page
    for recipe in RECIPES:  # a picture of every partition recipe, drawn at build time
        picture = site / "images" / "partitions" / file_name(recipe.partition)
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", recipe.partition
    api = (site / "api" / "run" / "index.html").read_text()
    assert "mcfl.run" in api and "mcfl.sweep" in api  # mkdocstrings rendered the API
    commands = (site / "cli" / "index.html").read_text()
    assert "mcfl plan" in commands and "--fesem-lambda" in commands


def test_an_undocumented_public_name_is_found():
    module = types.ModuleType("mcfl_docs_probe")
    module.__all__ = ["documented", "bare", "Bare", "VALUE"]

    def documented():
        """Has one."""

    def bare():
        pass

    class Bare:
        pass

    module.documented, module.bare, module.Bare, module.VALUE = documented, bare, Bare, (1, 2)
    sys.modules["mcfl_docs_probe"] = module
    try:
        assert api_check.undocumented_public_names(("mcfl_docs_probe",)) == [
            "mcfl_docs_probe.bare", "mcfl_docs_probe.Bare"]
    finally:
        del sys.modules["mcfl_docs_probe"]
    assert api_check.undocumented_public_names() == []  # mcfl's own public API


def test_an_algorithm_page_is_its_registration():
    page = algorithm_pages.algorithm_page("cfl")
    spec = registry.get("cfl")
    assert page.startswith("# `cfl`") and spec.reference in page
    for field in dataclasses.fields(spec.params):  # every hyperparameter, with its default
        key = settings.key_of(field)
        flag = f"| `--{key.replace('_', '-')}`"
        row = next(line for line in page.splitlines() if line.startswith(flag))
        assert f"`{field.default}`" in row or field.default in (True, False, None)
    assert "| `--cfl-separation` / `cfl_separation` | `0.1` | a number >= -2 and <= 2 |" in page
    assert "Client-level DP does not apply: its server bipartitions clients" in page
    flexcfl = algorithm_pages.algorithm_page("flexcfl")  # an optional setting and a choice
    assert "| `--pretrain-steps` / `pretrain_steps` | unset | an integer >= 1, or unset |" \
        in flexcfl
    assert "| `--measure` / `measure` | `edc` | one of edc, madc, random |" in flexcfl


def test_what_each_algorithm_keeps_per_client():
    assert algorithm_pages.kept_per_client(registry.get("local")) == "rows"
    assert algorithm_pages.kept_per_client(registry.get("ditto")) == "rows"
    assert algorithm_pages.kept_per_client(registry.get("fesem")) == "start"
    assert algorithm_pages.kept_per_client(registry.get("fedavg")) == "nothing"
    assert algorithm_pages.kept_per_client(registry.get("ifca")) == "nothing"


def test_privacy_and_participation_lines():
    ifca = algorithm_pages.privacy_text("ifca")
    assert ifca.startswith("Client-level DP covers its round: 1 noised sum")
    assert "per-cluster client counts released with noise" in ifca
    assert "2 noised sums" in algorithm_pages.privacy_text("scaffold")
    assert "`--dp-canaries` can audit it" in algorithm_pages.privacy_text("fedavg")
    assert "no `--dp-adaptive-quantile`" in algorithm_pages.privacy_text("fedsgd")
    assert "asynchronous" in algorithm_pages.privacy_text("fedbuff")
    assert "`--deadline` and `--over-select` do not apply" in \
        algorithm_pages.participation_text(registry.get("fedbuff"))
    assert "and `--client-sampling poisson`" in \
        algorithm_pages.participation_text(registry.get("fedavg"))
    assert "(not `--client-sampling poisson`" in \
        algorithm_pages.participation_text(registry.get("fesem"))


def test_the_command_line_page_has_every_command_and_flag():
    page = cli_page.cli_page()
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, sub in commands.items():
        assert f"## `mcfl {name}`" in page
        for action in sub._actions:
            if action.dest == "help":
                continue
            for flag in action.option_strings:
                assert f"`{flag}" in page, (name, flag)


def test_links_of_included_files_follow_them_into_the_site():
    text = ("[a](docs/guide/running.md) [b](BENCHMARKS.md#gpu) ![c](docs/images/shifts.png) "
            "[benchmarks/results/x/](benchmarks/results/x/) [d](tests/test_docs.py) "
            "[e](https://example.org) [f](#here) [g](notebooks/quickstart.ipynb)")
    assert site_links.with_site_links(text, "index.md") == (
        "[a](guide/running.md) [b](results/benchmarks.md#gpu) ![c](images/shifts.png) "
        "benchmarks/results/x/ d (`tests/test_docs.py`) "
        "[e](https://example.org) [f](#here) [g](notebooks/quickstart.ipynb)")
    assert site_links.with_site_links("[r](REPRODUCTION.md)", "results/benchmarks.md") == \
        "[r](../results/reproduction.md)"


def test_the_readme_is_short_with_its_commands_first():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200
    head = "\n".join(lines[:60])
    assert "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/mcfl demo" in head
    assert ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && "
            ".venv/bin/python -m pytest") in head
    assert (ROOT / ".ci" / "run").read_text().count(".venv/bin/python -m pytest") >= 1


def test_the_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#\s]+)", README.read_text()):
        if not re.match(r"[a-z]+:", target):
            assert (ROOT / target).exists(), target


def test_the_readme_python_runs(capsys):
    """The README's Python block, as written: FeSEM recovers the 4 planted groups, and the
    FedAvg sweep prints its mean and std."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(README), "exec"), {})
    fesem, fedavg = capsys.readouterr().out.strip().splitlines()
    assert fesem.startswith("FeSEM accuracy") and fesem.endswith("groups recovered (ARI) 1.0")
    assert re.fullmatch(r"FedAvg accuracy 0\.\d+ \+/- 0\.\d+", fedavg)
    # one model cannot fit four labellings: the clustered run is far ahead (0.89 against 0.31)
    assert float(fesem.split()[2]) > float(fedavg.split()[2]) + 0.3


def test_the_getting_started_python_runs(capsys):
    """The getting-started page's Python block, as written: a FeSEM run that recovers the
    planted groups, then a sweep with a row per value of lambda."""
    page = ROOT / "docs" / "getting-started.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(page), "exec"), {})
    run_line, *rows = capsys.readouterr().out.strip().splitlines()
    accuracy, ari = map(float, run_line.split())
    assert 0.2 < accuracy <= 1 and ari == 1.0
    assert [float(row.split()[0]) for row in rows] == [0.01, 0.1]


def test_the_getting_started_command_runs(tmp_path):
    """The getting-started page's first `mcfl run` command, as written (its folder moved to
    tmp_path): the run folder it describes is written, and it recovers the planted groups."""
    page = (ROOT / "docs" / "getting-started.md").read_text()
    command = next(block for block in re.findall(r"```bash\n(.*?)```", page, re.S)
                   if block.startswith("mcfl run"))
    argv = shlex.split(command.replace("\\\n", " "))[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "fesem")
    assert main(argv) == 0
    for name in ("run.json", "rounds.csv", "clients.csv", "summary.json"):
        assert (tmp_path / "fesem" / name).is_file(), name
    assert json.loads((tmp_path / "fesem" / "summary.json").read_text())["cluster_ari"] == 1.0
