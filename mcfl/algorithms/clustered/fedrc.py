"""FedRC (Guo, Tang and Lin, ICML 2024, "FedRC: Tackling Diverse Distribution Shifts Challenge
in Federated Learning by Robust Clustering").

FedEM's rounds (`mcfl.algorithms.clustered.fedem`) with FedRC's robust E-step: a row's posterior for
component m divides the component's likelihood by the component's label marginal,

    q(z_i = m)  ∝  pi_m P(y_i | x_i; theta_m) / P_m(y_i),

so that rows differing only in their label distribution (label shift) are not pulled apart,
while rows whose labels mean something else (concept shift) are. P_m(y) is estimated by the
server from every client's soft label counts sum_i q(z_i = m) [y_i = y] as of its last round
(a client never sampled counts 1 / classes of each label), floored at 1e-8 and normalised over
the labels, as the authors' code (LINs-lab/FedRC) does; the counts are client-store rows
beside pi. Everything else is FedEM's: pi from the posteriors' mean, every component trained on
its weighted loss, components averaged by n_t, each client evaluated with its pi-weighted
mixture of the components' predictions (the authors' reported accuracy), its cluster its
largest pi.

Defaults: FedEM's, with FedRC's label-marginal E-step; no hyperparameter of its own.
"""

from __future__ import annotations

from mcfl.algorithms.clustered.fedem import mixture_of_components
from mcfl.algorithms.framework.base import FederatedAlgorithm
from mcfl.algorithms.framework.registry import AlgorithmContext, register


@register("fedrc", reference="Guo et al., 2024, FedRC", clustered=True,
          summary="FedEM whose E-step divides each component's likelihood by its label "
          "marginal P_m(y) (estimated by the server from every client's soft label counts), "
          "so that label shifts share a component and concept shifts do not")
def fedrc(context: AlgorithmContext) -> FederatedAlgorithm:
    """FedRC with K = ``context.num_clusters`` components; a client's row is its pi_t [K] and
    its soft label counts [K, classes]."""
    return mixture_of_components(context, "fedrc", label_prior=True)
