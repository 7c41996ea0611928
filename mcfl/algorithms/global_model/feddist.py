"""FedDist and FedDWS: Reptile-style server steps (Nichol et al., 2018), the FeSEM paper's
baselines 9 and 10 (Xie et al., "Multi-Center Federated Learning", Table 1).

Sampled clients train from the global model W; the server moves W part of the way toward them:
``W <- W - eps * sum_k a_k (W - W_k)``, with equal weights ``a_k = 1 / S`` (FedDist) or
``a_k = n_k / sum_j n_j`` (FedDWS, "distance weighted by size"). eps = 0.6 is the authors'
code's value. This is FedAvg's round with a server step of eps (and, for FedDist, an unweighted
average), so both are `fedavg.averaging` with other settings.
"""

from __future__ import annotations

import dataclasses

from mcfl.algorithms.framework.base import FederatedAlgorithm
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.global_model.fedavg import averaging
from mcfl.settings import setting


@dataclasses.dataclass(frozen=True)
class FedDistParams:
    eps: float = setting(0.6, "server step eps of W <- W - eps * mean_k(W - W_k) (the authors' "
                         "code: 0.6)", key="feddist_eps", above=0)


@register("feddist", FedDistParams, reference="Xie et al. (FeSEM paper, baseline 9); Reptile",
          summary="FedAvg's round with a Reptile server step: W <- W - eps * mean_k(W - W_k), "
          "clients weighted equally")
def feddist(context: AlgorithmContext) -> FederatedAlgorithm:
    return averaging(context, lambda p: p.eps, size_weighted=False)


@register("feddws", FedDistParams, reference="Xie et al. (FeSEM paper, baseline 10)",
          summary="FedDist with the clients weighted by their samples n_k / sum_j n_j")
def feddws(context: AlgorithmContext) -> FederatedAlgorithm:
    return averaging(context, lambda p: p.eps, size_weighted=True)
