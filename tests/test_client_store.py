"""Client stores (`mcfl.store`): what clients keep between rounds in device memory, host memory
or on disk gives the same run; checkpoints name rows instead of copying them; kills, full disks
and unwritable folders lose nothing."""

from __future__ import annotations

import csv
import errno
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mcfl
from mcfl.algorithms.framework import registry
from mcfl.apps.cli import main
from mcfl.config import CLUSTERED_ONLY
from mcfl.files.atomic import WriteError
from mcfl.files.faults import FaultPlan
from mcfl.runs import embedding
from mcfl.runs import program as store_program
from mcfl.runs.execution import plan_run
from mcfl.runtime import memory
from mcfl.store import files as store_files
from mcfl.store.choose import choose_store
from mcfl.store.layout import RowLayout
from mcfl.store.stores import DiskStore, HostStore
from tests.fault_driver import mcfl_killed_at
from tests.test_checkpoint import SignalAt, assert_same_run

# Two planted groups (digits, rotated): clusterings without ties of exactly equal cost, which
# rounding alone decides (one outlier trimmed or alone in its cluster, either way).
BASE = dict(dataset="digits", partition="rotated:2", model="mlp", hidden=(8,), clients=12,
            rounds=3, clients_per_round=4, lr=0.05, clusters=2, eval_every=1, embed_clients=4,
            seed=3)
STATEFUL = {"local": {}, "fesem": {"fesem_restarts": 2},
            "robust": {"robust_centroid": "median"},
            # (rows of two trees; mixtures evaluated with their own apply; clusters from the
            # shared part)
            "fedrc": {},
            # (clustered, rows read only by training: the embedding starts from the shared
            # centers; StoCFL's cluster models go the same way)
            "fedsoft": {}}


def base_for(algorithm, embedding=True):
    """BASE for `algorithm`: K and the embedding only where it has clusters (another refuses
    them). Without `embedding`, a clustered run embeds no clients: the checks whose subject is
    not the embedding (test_every_store_gives_the_run_the_device_gives compares it in every
    store) skip its programs, about a second of compiling a run."""
    base = {k: v for k, v in BASE.items()
            if registry.get(algorithm).clustered or k not in CLUSTERED_ONLY}
    if not embedding and "embed_clients" in base:
        base["embed_clients"] = 0
    return base


def _without_timings(result):
    return [{k: v for k, v in row.items() if "second" not in k} for row in result.rounds]


def assert_same_rows(a, b):
    """The same rows to float32 rounding. (Fully optimised, as runs compile, the stores agree
    bit for bit; the suite compiles with XLA's passes off, where the device store's gather
    inside the round can round the training loss differently in the last bit.)"""
    a, b = _without_timings(a), _without_timings(b)
    assert [sorted(r) for r in a] == [sorted(r) for r in b]
    for x, y in zip(a, b):
        for key in x:
            if isinstance(x[key], str):  # cluster sizes
                assert x[key] == y[key], key
            elif key == "intra_cluster_distance":
                # a difference of sums (sum w ||W||^2 - sum ||s_k||^2 / W_k) that cancels to
                # 1e-3 of its terms: their float32 rounding shows at 1e-6 (seen on a Xeon)
                np.testing.assert_allclose(x[key], y[key], rtol=1e-5, atol=1e-5, err_msg=key)
            else:
                np.testing.assert_allclose(x[key], y[key], rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("algorithm", sorted(STATEFUL))
def test_every_store_gives_the_run_the_device_gives(algorithm):
    """Local keeps its models in the store; FeSEM's and Robust's starts stream every client's
    model through it and cluster them chunk by chunk (streamed k-means, trimmed k-means with
    medians). Rows, clients' scores and assignments are the device store's, bit for bit."""
    runs = {store: mcfl.run(mcfl.RunConfig(algorithm=algorithm, client_store=store,
                                           **base_for(algorithm), **STATEFUL[algorithm]))
            for store in ("device", "host", "disk")}
    device = runs["device"]
    assert device.summary["client_store"] == "device"
    for store in ("host", "disk"):
        run = runs[store]
        assert run.summary["client_store"] == store
        assert_same_rows(run, device)
        assert [c["cluster"] for c in run.clients if "cluster" in c] == \
            [c["cluster"] for c in device.clients if "cluster" in c]
        if device.assignments is not None:
            np.testing.assert_array_equal(run.assignments, device.assignments)
        if device.client_embedding is not None:  # streamed through this store's kind
            for name, value in device.client_embedding.items():
                np.testing.assert_allclose(run.client_embedding[name], value, rtol=1e-4,
                                           atol=1e-4, err_msg=name)


# Who takes part beyond the algorithm's own sample: a Poisson sample (slots that report
# nothing), and clients as they are (speeds, dropouts, and availability with over-selection,
# whose participants depend on the clock the rounds move).
PARTICIPATION = {
    "poisson": dict(client_sampling="poisson"),
    "system": dict(device_speeds="lognormal:0,1", client_dropout=0.3),
    "clock": dict(device_speeds="uniform:1,3", availability="diurnal:20,0.5",
                  over_select=0.5, client_dropout=0.2),
}


@pytest.mark.parametrize("participation", sorted(PARTICIPATION))
def test_every_store_runs_every_participation_rule_as_the_device_does(participation):
    """Personal models (Ditto's and Local's, rows every round writes back, but not for the
    slots that did not report), FedRep's heads (a Poisson sample runs with the algorithms DP
    covers) and FedSoft's (rows read by training only) in host memory and on disk give the
    device store's run."""
    extra = PARTICIPATION[participation]
    algorithms = ("ditto", "fedrep") if participation == "poisson" else ("local", "fedsoft")
    for algorithm in algorithms:
        config = mcfl.RunConfig(algorithm=algorithm,
                                **{**base_for(algorithm, embedding=False), "rounds": 4}, **extra)
        runs = {store: mcfl.run(config.replace(client_store=store))
                for store in ("device", "host", "disk")}
        reported = [row.get("clients_reported") for row in runs["device"].rounds]
        assert None not in reported and min(reported) < config.clients_per_round, reported
        for store in ("host", "disk"):
            assert runs[store].summary["client_store"] == store
            assert_same_rows(runs[store], runs["device"])
            assert [c["accuracy"] for c in runs[store].clients] == pytest.approx(
                [c["accuracy"] for c in runs["device"].clients], abs=1e-6)


def test_a_sweep_on_disk_runs_poisson_members_as_the_device_does():
    """The member axis on a Poisson round's present mask."""
    config = mcfl.RunConfig(algorithm="ditto", client_sampling="poisson", **base_for("ditto"))
    grid = {"lr": [0.02, 0.05]}
    on_device = mcfl.sweep(config, seeds=2, grid=grid)
    on_disk = mcfl.sweep(config.replace(client_store="disk"), seeds=2, grid=grid)
    assert_same_rows(on_disk, on_device)


def test_the_streamed_embedding_is_the_one_program_embedding(tmp_path):
    """Chunks of 3 clients and column blocks of a few hundred parameters (the last one padded),
    in host memory and in files: the same principal coordinates as the one program that holds
    every model, and the files are gone afterwards."""
    config = mcfl.RunConfig(algorithm="fesem", **base_for("fesem"), **STATEFUL["fesem"])
    result = mcfl.run(config.replace(embed_clients=0))
    dataset = mcfl.load_dataset(config)
    resolved = mcfl.resolve(config)
    plan = plan_run(resolved, dataset)
    algorithm = resolved.build_algorithm(plan.model, plan.clients_per_round)
    training = resolved.hyperparams(plan.model).training
    key = jax.random.key(5)
    state = result.state
    whole = embedding.client_embedding(algorithm, training, 10, state, dataset.arrays, key)
    chunk_bytes = 3 * 4 * plan.params_count  # 3 clients' models; columns: chunk_bytes / 40
    assert plan.params_count % (chunk_bytes // 40) != 0
    for on_disk in (False, True):
        streamed = embedding.streamed_client_embedding(
            embedding.EmbeddingTraining(algorithm, training), 10, state, dataset.arrays, key,
            on_disk=on_disk, folder=tmp_path, chunk_bytes=chunk_bytes)
        np.testing.assert_array_equal(streamed.clients, whole.clients)
        np.testing.assert_allclose(streamed.coords, whole.coords, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(streamed.explained, whole.explained, rtol=1e-4)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("algorithm", ["local", "fesem"])
def test_bfloat16_storage_is_the_same_in_every_store_and_close_to_float32(algorithm):
    """Local's models, and FeSEM's start (every client's model through the store), kept in
    bfloat16 by every store (the disk store once kept FeSEM's start in float32)."""
    config = mcfl.RunConfig(algorithm=algorithm, **base_for(algorithm, embedding=False),
                            **STATEFUL[algorithm])
    full = mcfl.run(config)
    half = {store: mcfl.run(config.replace(client_store=store, client_store_dtype="bfloat16"))
            for store in ("device", "disk")}
    assert_same_rows(half["device"], half["disk"])
    last, last_half = full.rounds[-1], half["disk"].rounds[-1]
    assert last["test_loss"] != last_half["test_loss"]  # the rows were rounded
    assert abs(last["accuracy_micro"] - last_half["accuracy_micro"]) < 0.05


def test_a_sweep_keeps_its_members_rows_in_one_store():
    config = mcfl.RunConfig(algorithm="local", **base_for("local"))
    on_device = mcfl.sweep(config, seeds=2, grid={"lr": [0.02, 0.05]})
    on_disk = mcfl.sweep(config.replace(client_store="disk"), seeds=2,
                         grid={"lr": [0.02, 0.05]})
    assert_same_rows(on_disk, on_device)


def test_auto_keeps_what_fits_on_the_device_and_goes_to_disk_otherwise():
    dataset = mcfl.load_dataset(mcfl.RunConfig(algorithm="local", **base_for("local")))
    config = mcfl.RunConfig(algorithm="local", **base_for("local"))
    resolved = mcfl.resolve(config)
    plan = plan_run(resolved, dataset)
    algorithm = resolved.build_algorithm(plan.model, plan.clients_per_round)
    hp = resolved.hyperparams(plan.model)
    row_bytes = 4 * plan.params_count
    choice = choose_store("auto", algorithm, "local", hp, dataset.arrays)
    assert (choice.kind, choice.stored_bytes) == ("device", 12 * row_bytes)
    with memory.limited(12 * row_bytes):  # more than half of it
        choice = choose_store("auto", algorithm, "local", hp, dataset.arrays)
    assert choice.kind == "disk" and "more than half" in choice.reason
    fedavg = mcfl.resolve(config.replace(algorithm="fedavg")).build_algorithm(
        plan.model, plan.clients_per_round)
    # nothing kept
    assert choose_store("disk", fedavg, "fedavg", hp, dataset.arrays).kind == "device"


@pytest.mark.parametrize("wrapper", [{"client_sampling": "round_robin_first"},
                                     {"shift": "swap_all", "shift_prob": 0.7}])
def test_the_wrappers_keep_the_rows_in_every_store(wrapper):
    """Local under a client schedule or a distribution shift: its models are the store's rows
    (the wrappers keep the algorithm's per-client state), so the disk store runs it and gives
    the device store's rows."""
    config = mcfl.RunConfig(algorithm="local", **base_for("local"), **wrapper)
    on_disk = mcfl.run(config.replace(client_store="disk"))
    assert on_disk.summary["client_store"] == "disk"
    assert_same_rows(on_disk, mcfl.run(config))


@pytest.mark.parametrize("algorithm", ["fedavg", "local"])
def test_fedbn_layers_are_rows_in_every_store(algorithm):
    """--bn local: each client's batch-norm layers are rows of the store (beside Local's own
    models), so a disk store runs FedBN and gives the device store's rows."""
    from tests.test_user_models import NormNet

    own_model = {k: v for k, v in base_for(algorithm).items() if k != "hidden"}  # (an MLP's)
    config = mcfl.RunConfig(algorithm=algorithm, bn="local", **own_model)
    on_disk = mcfl.run(config.replace(client_store="disk"), model=NormNet(10))
    on_device = mcfl.run(config, model=NormNet(10))
    assert on_disk.summary["client_store"] == "disk"
    assert on_device.summary["client_store"] == "device"
    assert_same_rows(on_disk, on_device)


def _rows(count, seed, layout):
    rng = np.random.default_rng(seed)
    return layout.pack({"w": rng.normal(size=(count, 3, 2)).astype(np.float32),
                        "b": rng.normal(size=(count, 2)).astype(jnp.bfloat16)})


def test_layout_packs_and_unpacks_every_leaf():
    layout = RowLayout.of({"w": np.zeros((3, 2), np.float32), "b": np.zeros(2, jnp.bfloat16)})
    assert layout.row_bytes == 3 * 2 * 4 + 2 * 2
    packed = _rows(5, 0, layout)
    again = layout.pack(layout.unpack(packed))
    np.testing.assert_array_equal(packed, again)


def _files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.row"))


def test_a_checkpoint_names_rows_and_keeps_only_what_a_manifest_names(tmp_path):
    """Round r writes client i as ``i_r.row``; a checkpoint saves the manifest (no row is
    copied); rows only an older checkpoint named go once a newer one is saved; restoring
    deletes rows written after the checkpoint."""
    layout = RowLayout.of({"w": np.zeros((3, 2), np.float32), "b": np.zeros(2, jnp.bfloat16)})
    store = DiskStore(1, 6, layout.row_bytes, tmp_path)
    store.scatter(np.array([[0, 1]]), _rows(2, 1, layout)[None], 1)
    manifest = store.manifest(1)
    store.checkpointed(manifest)
    store.scatter(np.array([[1, 2]]), _rows(2, 2, layout)[None], 2)
    # client 1's round-1 row stays: the checkpoint names it
    assert _files(tmp_path) == ["0/0/0_1.row", "0/0/1_1.row", "0/0/1_2.row", "0/0/2_2.row"]
    store.restore(manifest)
    assert _files(tmp_path) == ["0/0/0_1.row", "0/0/1_1.row"]
    rows, written = store.gather(np.array([[1, 0, 2]]))
    np.testing.assert_array_equal(written, [[True, True, False]])
    np.testing.assert_array_equal(rows[0, :2], _rows(2, 1, layout)[::-1])
    store.scatter(np.array([[1, 3]]), _rows(2, 3, layout)[None], 2)
    store.checkpointed(store.manifest(2))
    assert _files(tmp_path) == ["0/0/0_1.row", "0/0/1_2.row", "0/0/3_2.row"]


def test_a_host_checkpoint_writes_only_the_rows_changed_since_the_last(tmp_path, monkeypatch):
    layout = RowLayout.of({"w": np.zeros((3, 2), np.float32), "b": np.zeros(2, jnp.bfloat16)})
    store = HostStore(1, 100, layout.row_bytes, tmp_path)
    store.scatter(np.array([np.arange(40)]), _rows(40, 1, layout)[None], 1)
    store.checkpointed(store.manifest(1))
    written = []
    real_write = store.files.write
    monkeypatch.setattr(store.files, "write",
                        lambda m, clients, packed, g: (written.extend(clients.tolist()),
                                                       real_write(m, clients, packed, g)))
    store.scatter(np.array([[5, 60, 7]]), _rows(3, 2, layout)[None], 2)
    manifest = store.manifest(2)
    store.checkpointed(manifest)
    assert sorted(written) == [5, 7, 60]
    assert len(_files(tmp_path)) == 41
    again = HostStore(1, 100, layout.row_bytes, tmp_path)
    again.restore(manifest)
    np.testing.assert_array_equal(again.rows, store.rows)
    np.testing.assert_array_equal(again.written, store.written)


def test_an_unwritable_store_folder_is_one_line(tmp_path, monkeypatch):
    """A folder turned read-only (EROFS from every new file): `WriteError` names the row's
    file; the manifest keeps naming the rows before it."""
    layout = RowLayout.of({"w": np.zeros((3, 2), np.float32)})
    store = DiskStore(1, 4, layout.row_bytes, tmp_path)
    rows = layout.pack({"w": np.ones((1, 3, 2), np.float32)})[None]
    store.scatter(np.array([[1]]), rows, 1)

    def read_only(path, mode="r", *args, **kwargs):
        if "w" in mode:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(store_files, "open", read_only, raising=False)
    with pytest.raises(WriteError, match=r"cannot write '.*1_2\.row': Read-only file system"):
        store.scatter(np.array([[1]]), 2 * rows, 2)
    assert store.files.current[0, 1] == 1
    np.testing.assert_array_equal(store.gather(np.array([[1]]))[0], rows)


FLAGS = ["--algorithm", "local", "--clients", "12", "--clients-per-round", "4", "--rounds", "6",
         "--eval-every", "2", "--checkpoint-every", "2", "--client-store", "disk", "--no-cache"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    out = tmp_path_factory.mktemp("store") / "whole"
    assert main(["run", *FLAGS, "--out", str(out)]) == 0
    return out


def test_a_full_disk_under_the_store_is_one_line_and_the_run_resumes(whole, tmp_path, capsys,
                                                                      monkeypatch):
    out = tmp_path / "run"
    calls = []
    real_open = open

    def full_disk_open(path, mode="r", *args, **kwargs):
        if str(path).endswith(".row") and "w" in mode:
            calls.append(path)
            if len(calls) == 14:  # round 4's second row: rounds 1-2 are checkpointed
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, mode, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(store_files, "open", full_disk_open, raising=False)
        assert main(["run", *FLAGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "Traceback" not in err, err  # the store's note, the error
    assert "No space left on device" in err and "client_store" in err
    assert [r["round"] for r in _csv_rows(out)][:3] == ["1", "2", "3"]
    assert main(["run", "--resume", str(out)]) == 0
    assert_same_run(whole, out)


def _csv_rows(folder):
    with open(folder / "rounds.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("kill_at", [FaultPlan("store_write", 9),
                                     FaultPlan("store_write", 17, delay_ms=1)])
def test_kill_during_a_round_then_resume_equals_the_uninterrupted_run(whole, tmp_path, kill_at):
    """SIGKILL while a round's rows are being written (the 9th row file: round 3, after the
    checkpoint of round 2; or 1 ms into the 17th), then --resume."""
    out = tmp_path / "cut"
    command = mcfl_killed_at(kill_at, "run", *FLAGS, "--out", str(out))
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]
    assert main(["run", "--resume", str(out)]) == 0  # (in this process: `whole` compiled it)
    assert_same_run(whole, out)
    # only rows the last checkpoint names are left
    assert len(list((out / "client_store").rglob("*.row"))) <= 12


@pytest.mark.parametrize("algorithm, store", [("local", "host"), ("fesem", "disk")])
def test_a_stopped_run_resumes_from_its_store_without_its_start_again(algorithm, store,
                                                                       tmp_path, monkeypatch):
    """SIGINT at round 2, then resume: the same files as the uninterrupted run. A host store's
    checkpoint writes its rows to the run folder; FeSEM's start, which trained every client, is
    in the checkpoint and is not computed again."""
    config = mcfl.RunConfig(algorithm=algorithm, client_store=store,
                            **{**base_for(algorithm), "rounds": 4}, **STATEFUL[algorithm])
    mcfl.run(config, out_dir=tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        mcfl.run(config, out_dir=tmp_path / "cut", observers=(SignalAt(2),),
                 checkpoint_every=100)
    if store == "host":  # the rows the checkpoint needs, written at the checkpoint
        assert 0 < len(list((tmp_path / "cut" / "client_store").rglob("*.row"))) <= 8
    monkeypatch.setattr(store_program, "streamed_start", lambda *a: pytest.fail("start again"))
    mcfl.run(resume=tmp_path / "cut")
    assert_same_run(tmp_path / "whole", tmp_path / "cut")


def test_the_command_line_runs_a_shifted_local_on_disk(tmp_path, capsys):
    """`mcfl run --algorithm local --client-store disk --shift swap_all` (refused before the
    wrappers kept the algorithm's per-client state)."""
    out = tmp_path / "run"
    code = main(["run", "--algorithm", "local", "--client-store", "disk", "--shift",
                 "swap_all", "--shift-prob", "0.5", "--clients", "8", "--rounds", "2",
                 "--no-cache", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "client store: disk" in capsys.readouterr().err
    assert (out / "client_store").is_dir() and (out / "summary.json").is_file()
