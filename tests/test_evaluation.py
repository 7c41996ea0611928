"""Per-client accuracy / macro-F1 and their aggregates against scikit-learn."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score

from mcfl.data.federated import from_splits
from mcfl.engine import evaluate_counts
from mcfl.runs.evaluation import ClientMetrics, aggregate, client_metrics

NUM_CLASSES = 5


def _predict_from_feature(params, x):
    """A 'model' whose prediction for a row is the label stored in its first feature."""
    del params
    return jax.nn.one_hot(x[:, 0].astype(jnp.int32), NUM_CLASSES) * 10.0


def test_accuracy_and_f1_match_sklearn_on_random_predictions():
    rng = np.random.default_rng(0)
    sizes = np.array([1, 7, 40, 13, 300, 2, 25])
    owner = np.repeat(np.arange(sizes.size), sizes)
    y_true = rng.integers(0, NUM_CLASSES, owner.size)
    y_pred = rng.integers(0, NUM_CLASSES, owner.size)
    # Make a few clients better than chance so aggregates are not all alike.
    good = np.isin(owner, [2, 4]) & (rng.random(owner.size) < 0.6)
    y_pred[good] = y_true[good]
    x = y_pred[:, None].astype(np.float32)
    dataset = from_splits("eval", (x, y_true, owner), (x, y_true, owner), sizes.size, NUM_CLASSES)
    data = dataset.arrays
    counts = evaluate_counts(
        _predict_from_feature,
        data,
        {"w": jnp.zeros((1, 1))},
        jnp.zeros(sizes.size, jnp.int32),
        block_size=3,
        eval_batch=16,
    )
    metrics = client_metrics(jax.device_get(counts), dataset.test_counts())

    for c in range(sizes.size):
        sel = owner == c
        assert metrics.accuracy[c] == accuracy_score(y_true[sel], y_pred[sel])
        np.testing.assert_allclose(
            metrics.f1[c], f1_score(y_true[sel], y_pred[sel], average="macro"), rtol=1e-12
        )

    agg = aggregate(metrics)
    np.testing.assert_allclose(agg["accuracy_micro"], accuracy_score(y_true, y_pred))
    np.testing.assert_allclose(agg["accuracy_macro"], np.mean(metrics.accuracy))
    np.testing.assert_allclose(agg["f1_micro"], np.sum(sizes * metrics.f1) / sizes.sum())
    np.testing.assert_allclose(agg["f1_macro"], np.mean(metrics.f1))
    assert agg["accuracy_micro"] != agg["accuracy_macro"]


def test_group_accuracies_by_hand():
    """Group 0: clients with 10 and 30 test rows at 0.5 and 0.9 -> (5 + 27) / 40 = 0.8; group 1
    (the smallest, one client) 0.6; group 2's only client has no test rows and is skipped."""
    from mcfl.runs.evaluation import group_accuracies

    n = np.array([10, 30, 20, 0])
    metrics = ClientMetrics(n_test=n, accuracy=np.array([0.5, 0.9, 0.6, np.nan]),
                            f1=np.zeros(4), loss=np.zeros(4))
    out = group_accuracies(metrics, np.array([0, 0, 1, 2]))
    assert out["worst_group_accuracy"] == pytest.approx(0.6)
    # the smallest groups are 1 and 2 (one client each): the lowest id, 1
    assert out["smallest_group_accuracy"] == pytest.approx(0.6)
    out = group_accuracies(metrics._replace(accuracy=np.array([0.5, 0.9, 0.95, np.nan])),
                           np.array([0, 0, 1, 2]))
    assert out == {"worst_group_accuracy": pytest.approx(0.8),
                   "smallest_group_accuracy": pytest.approx(0.95)}
