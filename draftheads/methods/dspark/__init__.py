"""DSpark: DFlash's block drafted in ONE forward, then a light sequential Markov head (a low-rank
transition bias from the previous token) and a confidence head (each draft's acceptance estimate,
which the draft budget turns into how many drafts a step verifies)."""
from . import export, search
from .imports import NATIVE, SPECULATORS, is_native, read_dspark
from .heads import DSparkHeads
from .drafter import DSparkDrafter
from ...registry import EngineLayout, ImportLayout, Method, OneForwardSearch, TreeKind, register
from .loss import DSparkLoss


METHOD = register(Method(
    name="dspark",
    title="DSpark",
    summary="DFlash's one-forward block plus a Markov head drafting left to right and a confidence head",
    heads=DSparkHeads,
    loss=DSparkLoss,
    drafter=DSparkDrafter,
    tree=TreeKind.ONE_FORWARD,
    one_forward=OneForwardSearch(draft_seconds=search.draft_seconds, accuracy=search.markov_accuracy_table,
                                 ranks_draft_vocab=True),
    exports={"vllm": EngineLayout("dspark", export.export, check_engine=export.check_engine)},
    imports={
        SPECULATORS: ImportLayout(
            detect=lambda source: source.config.get("speculators_model_type") == "dspark",
            read=lambda source, target: read_dspark(source, target, SPECULATORS), rank=0,
            description="speculators DSpark: config speculators_model_type dspark, aux_hidden_state_layer_ids, markov_rank, transformer_layer_config",
            config_names=("speculator", "dspark")),
        NATIVE: ImportLayout(
            detect=is_native, read=lambda source, target: read_dspark(source, target, NATIVE), rank=0,
            description="DSpark, vLLM's dense Qwen3DSparkModel (DeepSpec): DFlash's tensors + markov_head.markov_w1/w2 (+ confidence_head.proj), config target_layer_ids, mask_token_id, markov_rank, block_size",
            config_names=('qwen3dsparkmodel', 'dspark')),
    },
))
