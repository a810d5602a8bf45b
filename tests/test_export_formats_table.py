"""Which engine holds which heads is declared once, by each method (`Method.exports`); the one
table `export/formats.py` gathers from it is what the exporter dispatches on, what its refusals
list and what the model card serves, so they cannot drift apart."""
import pytest

from draftheads.export.card import serve_lines
from draftheads.export.common import ExportError
from draftheads.export.exporter import engine_layout
from draftheads.export.formats import EXPORT_FORMATS, engine_layouts, formats_for, layouts_sentence
from draftheads.registry import methods


def test_the_table_is_what_the_methods_declare():
    table = engine_layouts()
    for method in methods():
        assert table.get(method.name, {}) == {fmt: layout.engine_name for fmt, layout in method.exports.items()}
        assert set(method.exports) <= set(EXPORT_FORMATS)
        assert formats_for(method.name) == tuple(f for f in EXPORT_FORMATS if f in method.exports)
    # the names the engines give each draft (vLLM's method, SGLang's algorithm, speculators' type)
    assert table == {
        "medusa": {"vllm": "medusa"},
        "eagle": {"vllm": "eagle", "sglang": "EAGLE"},
        "eagle3": {"vllm": "eagle3", "sglang": "EAGLE3", "speculators": "eagle3"},
        "peagle": {"vllm": "eagle3", "speculators": "peagle"},  # vLLM: EAGLE-3 with parallel_drafting
        "dflash": {"vllm": "dflash", "transformers": "dflash"},  # transformers: generate's speculation_type
        "dspark": {"vllm": "dspark"},
        "dflash2": {"vllm": "dflash"},  # vLLM: method dflash, the DFlash2DraftModel architecture picks its speculator
        "mtp": {"vllm": "mtp"},  # the target's own checkpoint layout, vLLM's mtp method
    }


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_a_format_refuses_the_methods_that_declare_no_layout_for_it_listing_every_layout(fmt):
    for method in methods():
        if fmt in method.exports:
            assert engine_layout(method, fmt) is method.exports[fmt]
            continue
        with pytest.raises(ExportError, match=f"{method.name} heads have no .* layout") as e:
            engine_layout(method, fmt)
        assert layouts_sentence() in str(e.value)
    assert "dflash (vllm, transformers)" in layouts_sentence() and "eagle3 (vllm, sglang, speculators)" in layouts_sentence()


def test_card_serves_in_the_engines_of_the_table():
    for method in methods():
        kind = method.name
        text = "\n".join(serve_lines({"head_type": kind, "num_heads": 3}, "runs/x/heads", "org/target"))
        for engine, title in (("vllm", "vLLM"), ("sglang", "SGLang")):
            assert (f"### Serve in {title}" in text) == (engine in formats_for(kind)), (kind, engine)
