"""The registry drives the config, the flags, --help and the README: what a new algorithm
gets from its registration alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import mcfl
from mcfl import settings
from mcfl.algorithms.framework import registry
from mcfl.apps.cli import build_parser
from mcfl.errors import ConfigError

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
RUNNING = ROOT / "docs" / "guide" / "running.md"  # the settings table
EXTENDING = ROOT / "docs" / "extending.md"  # "Adding an algorithm"


def test_the_readme_table_is_the_registry():
    text = README.read_text()
    table = text.split("<!-- algorithms:start -->\n")[1].split("\n<!-- algorithms:end -->")[0]
    assert table == registry.markdown_table()


def test_the_docs_settings_table_is_the_config():
    from mcfl.config import markdown_table

    text = RUNNING.read_text()
    table = text.split("<!-- settings:start -->\n")[1].split("\n<!-- settings:end -->")[0]
    assert table == markdown_table()
    for key in mcfl.config.SHARED_FIELDS:  # every setting has its row (a boolean both forms)
        flag = key.replace("_", "-")
        assert f"| `--{flag}` |" in table or f"| `--{flag}` / `--no-{flag}` |" in table, key


def test_every_clustered_algorithm_says_what_its_defaults_mean():
    """Each clustered algorithm's module docstring (what its page is generated from) has a
    "Defaults:" paragraph naming each of its hyperparameters' defaults against its paper."""
    import importlib

    for name, spec in registry.REGISTRY.items():
        if not spec.clustered or spec.asynchronous:
            continue
        doc = importlib.import_module(spec.factory.__module__).__doc__
        assert "\nDefaults: " in doc, f"{name} ({spec.factory.__module__}) has no Defaults"


def test_help_lists_every_hyperparameter_with_its_default():
    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]
    help_text = " ".join(run.format_help().split())
    for spec in registry.REGISTRY.values():
        for key in settings.fields_of(spec.params):
            assert "--" + key.replace("_", "-") in help_text, key
            assert spec.name in help_text
    assert "--fesem-lambda FESEM_LAMBDA [fesem, fesem_ma, dp_fesem] lambda of Eq. 6" in help_text
    assert "(default 0.05)" in help_text


def test_the_docs_example_registers_a_working_algorithm(tmp_path):
    code = EXTENDING.read_text().split("## Adding an algorithm")[1].split("```python\n")[1]
    code = code.split("```")[0]
    try:
        exec(compile(code, str(EXTENDING), "exec"), {})
        assert "fedavgm" in registry.names()
        config = mcfl.RunConfig(algorithm="fedavgm", fedavgm_beta=0.5, clients=12, rounds=2,
                                clients_per_round=4)
        result = mcfl.run(config)
        assert result.summary["final_accuracy_micro"] > 0
        assert "--fedavgm-beta" in build_parser().format_help() + " ".join(
            build_parser()._subparsers._group_actions[0].choices["run"].format_help().split())
        with pytest.raises(ConfigError, match="fedavgm_beta must be a number >= 0 and < 1"):
            mcfl.RunConfig(algorithm="fedavgm", fedavgm_beta=1.0)
        # the new hyperparameter sweeps as one program, each member equal to its own run
        swept = mcfl.sweep(config, seeds=1, grid={"fedavgm_beta": [0.0, 0.5]})
        assert len(swept.groups) == 1 and swept.groups[0]["traced"] == ["fedavgm_beta"]
        finals = [m["final_accuracy_micro"] for m in swept.members]
        assert finals[1] == pytest.approx(result.summary["final_accuracy_micro"], abs=1e-6)
        alone = mcfl.run(config.replace(fedavgm_beta=0.0)).summary["final_accuracy_micro"]
        assert finals[0] == pytest.approx(alone, abs=1e-6)
    finally:
        registry.REGISTRY.pop("fedavgm", None)


def test_config_files_keep_their_flat_keys(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('algorithm = "fesem"\nfesem_lambda = 0.2\nfesem_last_layer = true\n')
    config = mcfl.from_dict(mcfl.load_file(path))
    assert config.params.lam == 0.2 and config.fesem_last_layer is True
    assert config.to_dict()["fesem_lambda"] == 0.2
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"algorithm": "fesem", "fesem_last_layer": "false"}))
    with pytest.raises(ConfigError, match="fesem_last_layer must be true or false, got 'false'"):
        mcfl.from_dict(mcfl.load_file(bad))
    with pytest.raises(ConfigError, match=re.escape("eta_g applies to fedgroup, flexcfl, not "
                                                    "'fesem'")):
        mcfl.RunConfig(algorithm="fesem", eta_g=0.1)


def test_changing_the_algorithm_keeps_shared_hyperparameters():
    fedprox = mcfl.RunConfig(algorithm="fedprox", mu=0.5, server_lr=0.8)
    assert fedprox.replace(algorithm="feddane").mu == 0.5  # both take mu
    fedavg = fedprox.replace(algorithm="fedavg")
    assert fedavg.server_lr == 0.8 and "mu" not in fedavg.to_dict()
