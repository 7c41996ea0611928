"""Which algorithms client-level DP covers, and how each one's round is accounted.

DP-FedAvg's guarantee (McMahan et al., ICLR 2018) holds for a server that sees the clients only
through noised sums of their clipped updates. An algorithm qualifies when every message its
server reads goes through such a sum (`mcfl.privacy.mechanism`); its entry says how many sums a
round releases about the same clients and whether per-segment counts are released (clusters).
An algorithm whose server reads individual clients' models, updates or statistics is refused
with the reason, in one line.

What the server learns of a client's cluster (IFCA, dp_fesem): the client picks its cluster
itself, from the K models the server broadcasts, and its update enters that cluster's noised
sum; the per-cluster client counts are released noised (sensitivity 1), so the choice of any
one client is covered by the same guarantee. The clusters mcfl records for each client (for
evaluation and ARI) are the simulator's measurement, which no server step reads.
"""

from __future__ import annotations

from typing import NamedTuple

from mcfl.errors import ConfigError


class Covered(NamedTuple):
    """An algorithm's round under DP: `sums` noised sums about the same clients, per-segment
    counts released (`noised_counts`), and whether its round feeds adaptive clipping the
    clients' update norms (`adaptive`: rounds built on the skeleton's `aggregate`)."""

    sums: int = 1
    noised_counts: bool = False
    adaptive: bool = True


COVERED: dict[str, Covered] = {
    "fedavg": Covered(),
    "fedprox": Covered(),
    "feddist": Covered(),
    "feddws": Covered(),
    "perfedavg": Covered(),
    "ditto": Covered(),  # its shared model; the personal models never leave the clients
    "ifca": Covered(noised_counts=True),
    # (its clip relative to the joined center is the run's C: not adaptive)
    "dp_fesem": Covered(noised_counts=True, adaptive=False),
    "fedsgd": Covered(adaptive=False),  # the gradient is the message
    "feddane": Covered(sums=2, adaptive=False),  # gradients, then models
    "scaffold": Covered(sums=2, adaptive=False),  # model updates and control-variate changes
    # the K components' updates of a client clipped jointly, one sum over the components
    "fedem": Covered(adaptive=False),
    "fedper": Covered(adaptive=False),  # the shared layers
    "lg_fedavg": Covered(adaptive=False),
    "fedrep": Covered(adaptive=False),  # the body
    "apfl": Covered(adaptive=False),  # the global model w
    "pfedme": Covered(adaptive=False),  # w
}

REFUSED: dict[str, str] = {
    "local": "every client trains alone and sends nothing: there is nothing to make private",
    "fednova": "its server weighs each update by 1 / (its local steps) and scales the step by "
               "tau_eff from the clients' sizes and step counts, which DP's equal, bounded "
               "weights do not give (fedavg with --local-steps gives every client the same "
               "steps)",
    "fesem": "its server's E-step (Eq. 9) reads each client's trained model to assign it to the "
             "nearest center; dp_fesem is its private form (the client picks its center)",
    "fesem_ma": "its server reads each client's trained model (E-step and matched averaging)",
    "cfl": "its server bipartitions clients by the cosine similarities of their individual "
           "updates",
    "cflgp": "its server clusters clients by the gradients each one sends (its gradient "
             "profile)",
    "flux": "its server clusters clients by the descriptor each one sends (the moments of its "
            "data's latent features, per class)",
    "fedgwc": "its server rewards each client by its own per-step training losses (its "
              "Gaussian rewards) and clusters clients by them",
    "fedgroup": "its server groups clients by the directions of their individual updates "
                "(EDC)",
    "flexcfl": "its server groups clients by the directions of their individual updates (EDC)",
    "flhc": "its server clusters clients hierarchically on their individual updates",
    "pacfl": "its server clusters clients by the principal angles of the data subspaces each "
             "one sends",
    "robust": "its server clusters and trims individual clients' models",
    "stocfl": "its server clusters clients by the similarity of their individual models",
    "fedsoft": "its server averages the clients' own models (not updates from a model it sent), "
               "which no clipping of an update bounds",
    "fedrc": "its server sums the clients' label statistics (the label prior) without noise",
    "fedbuff": "it is asynchronous: clients join as others finish, which the accountant's "
               "rounds of sampled clients do not describe",
    "fedasync": "it is asynchronous: each arriving model is mixed in alone, which the "
                "accountant's rounds of sampled clients do not describe",
    "ifca_async": "it is asynchronous: clients join as others finish, which the accountant's "
                  "rounds of sampled clients do not describe",
}


# Algorithms whose server keeps one global model in ``state.params``, summed in one segment:
# the canaries' check measures its change (`mcfl.privacy.canaries`).
CANARY_ALGORITHMS = ("fedavg", "fedprox", "feddist", "feddws")


def covered(algorithm: str, what: str = "--dp-*") -> Covered:
    """How `algorithm`'s round is made private, or a `ConfigError` saying why it cannot be;
    `what` names the setting that asked (Poisson sampling needs a round that honours the
    reporting mask, as DP's do: ``--client-sampling poisson``)."""
    if algorithm in COVERED:
        return COVERED[algorithm]
    reason = REFUSED.get(algorithm, "it is not one mcfl's DP covers")
    private = ", ".join(COVERED)
    if what == "--dp-*":
        raise ConfigError(f"{what} is not available with --algorithm {algorithm}: {reason}; "
                          f"algorithms with client-level DP: {private}")
    raise ConfigError(f"{what} runs with the algorithms whose rounds client-level DP covers "
                      f"(their rounds honour a round's reporting mask), not --algorithm "
                      f"{algorithm} ({reason}); those algorithms: {private}")


def check_adaptive(algorithm: str) -> None:
    """Refuse adaptive clipping for an algorithm whose round does not report update norms."""
    if not covered(algorithm).adaptive:
        adaptive = ", ".join(name for name, c in COVERED.items() if c.adaptive)
        raise ConfigError(f"--dp-adaptive-quantile is not available with --algorithm "
                          f"{algorithm} (its round does not feed the clients' update norms "
                          f"to the clipping step); available with: {adaptive}")
