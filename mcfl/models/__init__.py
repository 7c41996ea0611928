"""Models: the papers' networks, the zoo of recent clustered-FL workloads, any flax module a
user brings, and the registry that names them (`mcfl.models.registry`)."""

from mcfl.models import zoo, zoo_text  # noqa: F401,E402  (they register their models)
from mcfl.models.build import make_model
from mcfl.models.paper import (
    CONV_IMPLEMENTATIONS,
    MCLR,
    MLP,
    CelebaConvNet,
    ConvNet,
    PatchConv,
    conv_as_matmul,
    count_params,
    max_pool_2x2,
    max_pool_2x2_same,
    resolve_conv,
)
from mcfl.models.registry import names, register, resolve
from mcfl.models.spec import FactoredLayer, HiddenUnits, ModelSpec, from_module

__all__ = [
    "CONV_IMPLEMENTATIONS", "MLP", "CelebaConvNet", "ConvNet", "FactoredLayer",
    "HiddenUnits", "MCLR", "ModelSpec", "PatchConv", "conv_as_matmul", "count_params",
    "from_module", "make_model", "max_pool_2x2", "max_pool_2x2_same", "names", "register",
    "resolve", "resolve_conv",
]
