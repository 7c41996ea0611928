"""Client schedules (mcfl.algorithms.wrappers.schedule): the first pass of round_robin_first trains
every client once, in a keyed order, then rounds sample at random; algorithms train exactly
the scheduled clients."""

from __future__ import annotations

import chex
import jax
import numpy as np
from conftest import algorithm as build
from conftest import ragged_dataset, wrapped
from reference import reference_local_train

import mcfl
from mcfl.algorithms.wrappers.schedule import ScheduleState, scheduled_clients, with_schedule
from mcfl.engine import LocalTraining
from mcfl.engine.sampling import sample_clients
from mcfl.models import make_model


def _schedule(seed: int = 0) -> ScheduleState:
    return ScheduleState(jax.random.key_data(jax.random.key(seed)))


def test_first_pass_visits_every_client_once_then_samples_at_random():
    key = jax.random.key(3)
    windows = [np.asarray(scheduled_clients(_schedule(), key, 10, 4, r)) for r in (1, 2, 3)]
    for w in windows:
        assert len(set(w.tolist())) == 4  # distinct clients in a round
    order = np.concatenate(windows)  # 12 positions of a 10-client order: wraps by 2
    assert sorted(order[:10].tolist()) == list(range(10))
    assert order[10:].tolist() == order[:2].tolist()
    assert order[:10].tolist() != list(range(10))  # a keyed order, not the list's
    other = np.asarray(scheduled_clients(_schedule(seed=1), key, 10, 4, 1))
    assert other.tolist() != windows[0].tolist()  # another run, another order
    after = scheduled_clients(_schedule(), key, 10, 4, 4)  # ceil(10 / 4) = 3 rounds done
    np.testing.assert_array_equal(after, sample_clients(key, 10, 4))


def test_fedavg_trains_the_scheduled_clients():
    """A scheduled FedAvg round equals the per-client reference loop on the clients the
    schedule names (not on those FedAvg would have sampled)."""
    dataset = ragged_dataset([3, 30, 17, 40, 9, 64, 12])
    data = dataset.arrays
    model = make_model("mclr", (5,), dataset.num_classes)
    training = LocalTraining(model.apply, lr=0.05, batch_size=10)
    algorithm = wrapped(build("fedavg", model, training, 3, 3), with_schedule,
                        "round_robin_first", 3)
    state = algorithm.init(data, jax.random.key(0))
    params = state[0].params
    key = jax.random.key(7)
    new_state, _ = jax.jit(algorithm.round)(state, data, key, 1)
    pick_key, inner_key = jax.random.split(key)
    clients = np.asarray(scheduled_clients(state[1], pick_key, 7, 3, 1))
    _, train_key = jax.random.split(inner_key)
    models = [reference_local_train(training, data, train_key, params, int(c))[0]
              for c in clients]
    w = np.asarray([float(data.train_counts[c]) for c in clients])
    w = w / w.sum()
    expected = jax.tree.map(lambda *leaves: sum(wi * leaf for wi, leaf in zip(w, leaves)),
                            *models)
    chex.assert_trees_all_close(new_state[0].params, expected, atol=1e-5)


def test_flexcfl_groups_every_client_after_the_first_pass():
    """40 clients, 5 a round, 4 in the group cold start: the paper's score needs every client
    in a group, which the first pass guarantees at round ceil(40 / 5) = 8 and not before (after
    7 rounds, 5 clients were never visited, at most 4 of them pre-trained at the cold start);
    scanned rounds give the same rows."""
    config = mcfl.RunConfig(algorithm="flexcfl", clients=40, clients_per_round=5, clusters=2,
                            pretrain_scale=2, rounds=9, eval_every=1, embed_clients=0,
                            client_sampling="round_robin_first")
    rows = mcfl.run(config.replace(scan_rounds="off")).rounds
    waiting = [int(r["clients_waiting"]) for r in rows]
    assert waiting[6] > 0 and waiting[7:] == [0, 0]
    scanned = mcfl.run(config.replace(scan_rounds="on", eval_every=3)).rounds
    for a, b in zip(rows[2::3], scanned[2::3]):
        assert a["accuracy_micro"] == b["accuracy_micro"]
        assert a["clients_waiting"] == b["clients_waiting"]
