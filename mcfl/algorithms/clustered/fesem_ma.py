"""FeSEM-MA: FeSEM whose M-step averages matched models (Xie et al., "Multi-Center Federated
Learning", Sec. 5.1 and Table 3; matched averaging after FedMA, Wang et al., 2020).

The round is FeSEM's (`mcfl.algorithms.clustered.fesem`): sampled clients train from their center
with Eq. 8's proximal term and join their nearest center (E-step). Before the M-step averages a
center's members, each member's hidden units are permuted to match the center's, layer by
layer from the input, by a Hungarian assignment on the units' incoming weights and biases
(`mcfl.algorithms.clustered.matching`). Models without hidden layers (MCLR) have nothing to match:
there FeSEM-MA is FeSEM. The initial clustering is FeSEM's: every local model starts from the same
W_0, so their units start in the same order.

Defaults: FeSEM's (`mcfl.algorithms.clustered.fesem`), the matched averaging of Sec. 5.1 being the
only difference.
"""

from __future__ import annotations

import jax

from mcfl.algorithms.clustered.fesem import FeSEMParams, fesem
from mcfl.algorithms.clustered.matching import align
from mcfl.algorithms.framework.base import FederatedAlgorithm
from mcfl.algorithms.framework.registry import AlgorithmContext, register


@register("fesem_ma", FeSEMParams, clustered=True,
          reference="Xie et al., 2020 / 2023, Multi-Center FL (FeSEM-MA)",
          summary="FeSEM whose M-step first permutes each member's hidden units to match its "
          "center's (Hungarian assignment, layer by layer), then averages")
def fesem_ma(context: AlgorithmContext) -> FederatedAlgorithm:
    hidden = context.model.hidden_units

    def aligned(models, centers):
        """Align each model of a block [b, ...] to the center [b, ...] it joined."""
        if not hidden:
            return models
        return jax.vmap(lambda m, c: align(m, c, hidden))(models, centers)

    return fesem(context, align_to_centers=aligned)
