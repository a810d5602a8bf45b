"""Strict scalar types for the config dataclasses (experiment YAML and data pipeline).

pydantic's lax mode would read ``"8"`` as 8 and ``"yes"`` as True; a config value of the wrong
type is an error here instead. Nested sections stay lax so that they can be given as mappings.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from annotated_types import Ge
from pydantic import AllowInfNan, BeforeValidator, ConfigDict, Strict


def _float_literal(value: Any) -> Any:
    """A float written as a string (``"1e-3"``, as YAML 1.1 tools read it) is a float; anything
    else that is not a number is then refused by the strict check."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


CHECKED = ConfigDict(extra="forbid")  # an unknown key is an error, never ignored
Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]
Int = Annotated[int, Strict()]
# An int is accepted too; inf and NaN are not (``train.lr: .inf`` trained to NaN checkpoints).
Float = Annotated[float, BeforeValidator(_float_literal), Strict(), AllowInfNan(False)]
Positive = Annotated[int, Strict(), Ge(1)]
NonNegative = Annotated[int, Strict(), Ge(0)]

#: `heads.loss`: how a draft distribution is scored against the target's (draftheads/train/target_loss.py
#: says what each one is). Here, below both the config and the losses, so both read one list.
TargetLoss = Literal["soft_ce", "kl", "ce", "lk"]
TARGET_LOSSES: tuple[str, ...] = get_args(TargetLoss)
