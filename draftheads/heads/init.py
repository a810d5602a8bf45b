"""How fresh heads start: the initialisation schemes every head type offers (config ``heads.init``).

"identity" (the default): what each head type's constructor does. A fresh head's blocks are the
identity on their residual stream: Medusa/Hydra residual blocks start at zero (and Hydra's input
map at [I | 0]), EAGLE's fc at [0 | I], every draft decoder layer's output projections (o_proj,
down_proj) at zero, the remaining draft-layer weights, EAGLE-3's fc and its own LM head at
N(0, 0.02). A fresh Medusa head then predicts what the target's LM head predicts, a fresh EAGLE
layer passes its input through.

"torch": every linear and norm the heads own at PyTorch's own default (``reset_parameters``:
kaiming-uniform weights, i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), the same for biases; norms at
one). This is what the paper authors' EAGLE-3 trainer (SafeAILab/EAGLE, eagle/traineagle3/cnets.py)
trains from: its draft layer, fc and draft-vocabulary LM head are plain ``nn.Linear`` modules that
are never re-initialised. It is written generically (every submodule with ``reset_parameters``),
so it covers every head type, including ones added later.

Under both schemes, what a head type copies out of the target (Medusa's own LM heads start as
copies of the target's) is copied again afterwards: those copies are the head's starting point,
not an initialisation draw.
"""
from __future__ import annotations

from torch import nn

INIT_SCHEMES = ("identity", "torch")


def apply_init(heads: nn.Module, scheme: str, target: nn.Module) -> nn.Module:
    """Re-initialise the fresh ``heads`` by ``scheme`` (one of `INIT_SCHEMES`); returns them."""
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"unknown heads init scheme {scheme!r}; valid: {', '.join(INIT_SCHEMES)}")
    if scheme == "identity":  # what the constructors already did
        return heads
    for module in heads.modules():
        if module is not heads and callable(getattr(module, "reset_parameters", None)):
            module.reset_parameters()
    heads.init_from_target(target)
    return heads
