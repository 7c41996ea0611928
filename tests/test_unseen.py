"""Clients held out of training (``--unseen-share``, `mcfl.data.unseen`) and the label-free
choice of the model that serves them (`mcfl.engine.newcomers`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import planted_gaussian

import mcfl
from mcfl.data import with_held_out
from mcfl.data.federated import subset_clients
from mcfl.data.unseen import held_out_clients
from mcfl.engine.newcomers import most_confident, prediction_entropies
from mcfl.errors import ConfigError, DataError
from mcfl.models import make_model

BASE = dict(dataset="digits", clients=16, rounds=3, eval_every=3, local_epochs=1,
            batch_size=10, lr=0.1, seed=2)


def test_held_out_clients_are_drawn_from_every_group():
    groups = np.array([0] * 10 + [1] * 6 + [2] * 1)
    held = held_out_clients(groups.size, 0.5, groups, np.random.default_rng(0))
    # round(0.5 * 10) = 5 and round(0.5 * 6) = 3; the lone client of group 2 keeps training
    assert np.bincount(groups[held], minlength=3).tolist() == [5, 3, 0]
    assert np.array_equal(held, np.sort(held)) and np.unique(held).size == held.size
    with pytest.raises(DataError, match="--unseen-share 0.01 of 20 clients holds out none"):
        held_out_clients(20, 0.01, None, np.random.default_rng(0))


@pytest.mark.parametrize("share", [0, 1, 1.5, float("nan"), "half"])
def test_a_share_outside_zero_one_is_refused(share):
    with pytest.raises(ConfigError, match="unseen_share"):
        mcfl.RunConfig(**BASE, unseen_share=share)


def test_a_bad_share_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    from mcfl.apps.cli import main

    code = main(["run", "--dataset", "digits", "--clients", "8", "--unseen-share", "1",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "unseen" in err[0]
    assert not (tmp_path / "run").exists()


def test_held_out_clients_never_train():
    """A run with a held-out share trains exactly as a run on the training clients alone: the
    same rows of training metrics and scores, round by round."""
    config = mcfl.RunConfig(**BASE, algorithm="fedavg", partition="shift_x:2@1",
                            unseen_share=0.25)
    full = mcfl.load_dataset(config)
    with_unseen = mcfl.run(config, dataset=full)
    training = with_held_out(full, mcfl.resolve(config).data)
    assert training.num_clients == 12 and training.unseen.num_clients == 4
    assert set(training.client_ids).isdisjoint(training.unseen.client_ids)
    alone = mcfl.run(config.replace(unseen_share=None, clients=12),
                     dataset=subset_clients(full, [int(c) for c in training.client_ids]))
    for a, b in zip(with_unseen.rounds, alone.rounds):
        for key in ("train_loss", "accuracy_micro", "discrepancy"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-6), key
    assert "unseen_accuracy_micro" in with_unseen.rounds[-1]
    assert with_unseen.summary["dataset"]["unseen_clients"] == 4
    assert "unseen_accuracy_micro" not in alone.rounds[-1]


def test_the_most_confident_model_equals_a_per_client_loop():
    data = planted_gaussian(12, 2).arrays
    model = make_model("mclr", (12,), 10)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    models = jax.vmap(model.init)(keys)
    models = jax.tree.map(lambda m: m * 3.0, models)  # confident enough to differ
    chosen = np.asarray(most_confident(model.apply, data, models))
    entropies = np.asarray(prediction_entropies(model.apply, data, models,
                                                jnp.arange(12, dtype=jnp.int32)))
    x, offsets, counts = (np.asarray(data.x_train), np.asarray(data.train_offsets),
                          np.asarray(data.train_counts))
    for client in range(12):  # the reference: one client, one model at a time, in NumPy
        rows = x[offsets[client]:offsets[client] + counts[client]]
        expected = []
        for k in range(3):
            logits = np.asarray(model.apply(jax.tree.map(lambda m, k=k: m[k], models),
                                            jnp.asarray(rows)), np.float64)
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            expected.append(np.mean(-np.sum(p * np.log(p), 1)))
        np.testing.assert_allclose(entropies[client], expected, rtol=1e-4)
        assert chosen[client] == int(np.argmin(expected))
    # the labels are never read: scrambling them changes nothing
    scrambled = data.replace(y_train=jnp.roll(data.y_train, 7))
    assert np.array_equal(np.asarray(most_confident(model.apply, scrambled, models)), chosen)


def test_fedavg_serves_newcomers_its_global_model_and_clustered_ones_a_cluster():
    config = mcfl.RunConfig(**BASE, algorithm="fedavg", partition="shift_x:2@1",
                            unseen_share=0.25)
    result = mcfl.run(config)
    last = result.rounds[-1]
    assert 0 <= last["unseen_accuracy_micro"] <= 1
    assert "unseen_cluster_ari" not in last  # one model: nothing to agree with groups
    clustered = mcfl.run(config.replace(algorithm="ifca", clusters=2))
    assert "unseen_cluster_ari" in clustered.rounds[-1]
    assert "unseen_worst_group_accuracy" in clustered.summary
    local = mcfl.run(config.replace(algorithm="local"))
    assert "unseen_accuracy_micro" not in local.rounds[-1]  # a personal model needs the client
