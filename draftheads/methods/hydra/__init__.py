"""Hydra: Medusa heads that also read the tokens drafted before theirs (Ankner et al., 2024);
trained by Medusa's loss, drafted as a static tree. No engine holds them."""
from .heads import HydraHeads
from .drafter import HydraDrafter
from ...registry import Method, TreeKind, register
from ..medusa.loss import MedusaLoss

METHOD = register(Method(
    name="hydra",
    title="Hydra",
    summary="Medusa heads that read the drafted tokens before theirs; a static tree",
    heads=HydraHeads,
    loss=MedusaLoss,
    drafter=HydraDrafter,
    tree=TreeKind.STATIC,
))
