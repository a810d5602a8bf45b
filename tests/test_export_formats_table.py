"""The one table of which engine holds which heads (export/formats.py) agrees with what every
exporter actually dispatches, so the card, the refusals and the exporters cannot drift apart."""
from types import SimpleNamespace

import pytest

from draftheads.export import sglang, speculators, vllm
from draftheads.export.card import serve_lines
from draftheads.export.common import ExportError
from draftheads.export.formats import ENGINE_LAYOUTS, EXPORT_FORMATS, formats_for, layouts_sentence
from draftheads.heads.io import head_types


def held(fmt):
    return {kind for kind, layouts in ENGINE_LAYOUTS.items() if fmt in layouts}


def test_dispatch_tables_equal_the_one_table():
    assert set(vllm.LAYOUTS) == held("vllm")
    assert set(sglang.LAYOUTS) == held("sglang")
    assert set(ENGINE_LAYOUTS) <= set(head_types())
    assert all(set(layouts) <= set(EXPORT_FORMATS) for layouts in ENGINE_LAYOUTS.values())


@pytest.mark.parametrize("kind", sorted(set(head_types()) - held("speculators")))
def test_speculators_refuses_what_the_table_does_not_hold(kind):
    fake = SimpleNamespace(config=SimpleNamespace(head_type=kind))
    with pytest.raises(ExportError, match="EAGLE-3"):
        speculators.export(fake, verifier="v", verifier_cfg={}, num_speculative_tokens=None)


@pytest.mark.parametrize("exporter", [vllm, sglang])
def test_refusal_lists_every_layout(exporter):
    missing = sorted(set(head_types()) - set(exporter.LAYOUTS))[0]
    fake = SimpleNamespace(config=SimpleNamespace(head_type=missing))
    with pytest.raises(ExportError) as e:
        exporter.export(fake, verifier="v", verifier_cfg={}, num_speculative_tokens=None)
    assert layouts_sentence() in str(e.value)
    assert "dflash (vllm)" in layouts_sentence() and "eagle3 (vllm, sglang, speculators)" in layouts_sentence()


def test_card_serves_in_the_engines_of_the_table():
    for kind in head_types():
        text = "\n".join(serve_lines({"head_type": kind, "num_heads": 3}, "runs/x/heads", "org/target"))
        for engine, title in (("vllm", "vLLM"), ("sglang", "SGLang")):
            assert (f"### Serve in {title}" in text) == (engine in formats_for(kind)), (kind, engine)
