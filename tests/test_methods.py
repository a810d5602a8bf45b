"""The method registry (draftheads/registry.py, draftheads/methods/): each method declared once,
found by name or by its heads, and every layer dispatching through it, not through names."""
from __future__ import annotations

import json

import pytest
import torch

import draftheads as dh
from draftheads import registry
from draftheads.export.formats import EXPORT_FORMATS, import_formats
from draftheads.registry import EngineLayout, ImportLayout, Method, TreeKind, UnknownMethodError
from draftheads.train.head_loss import HeadLoss, HeadLossOutput, LossBatch, LossSettings

ALL = ("medusa", "hydra", "eagle", "eagle3", "peagle", "dflash", "dspark", "dflash2", "mtp")


def test_every_method_is_registered_once_under_its_heads_name():
    assert registry.names() == ALL
    for method in registry.methods():
        assert method.heads.head_type == method.name
        assert registry.method_named(method.name) is method
        assert registry.method_of(method.heads) is method


def test_every_method_declares_its_parts():
    for method in registry.methods():
        assert isinstance(method.tree, TreeKind), method
        assert issubclass(method.loss, HeadLoss), method
        assert callable(method.drafter), method
        assert method.title and method.summary, method
        assert set(method.exports) <= set(EXPORT_FORMATS), method
        assert all(isinstance(layout, EngineLayout) and layout.engine_name for layout in method.exports.values())
        assert all(isinstance(layout, ImportLayout) and layout.description and layout.config_names
                   for layout in method.imports.values()), method
        assert set(method.imports) <= set(import_formats()), method
    assert sum(m.default for m in registry.methods()) == 1 and registry.default_head_type() == "medusa"


def test_a_subclass_of_a_methods_heads_belongs_to_that_method():
    class MyMedusa(dh.MedusaHeads):
        pass

    assert registry.method_of(MyMedusa).name == "medusa"
    assert registry.method_of(dh.Eagle3Head).name == "eagle3"  # not EAGLE's, although it subclasses EagleHead


def test_an_unknown_head_type_names_the_known_ones():
    with pytest.raises(UnknownMethodError, match="unknown head type 'medusa2'.*dflash.*eagle.*medusa"):
        registry.method_named("medusa2")

    class Stray(torch.nn.Module):
        head_type = "stray"

    with pytest.raises(UnknownMethodError, match="Stray heads .*'stray'.*no registered method"):
        registry.method_of(Stray())


def test_register_refuses_a_second_method_of_a_name_and_a_heads_class_of_another_name():
    medusa = registry.method_named("medusa")
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(Method(name="medusa", title="x", heads=dh.MedusaHeads, loss=HeadLoss, drafter=print,
                                 tree=TreeKind.STATIC))
    with pytest.raises(ValueError, match="has head_type 'hydra', not 'medusa2'"):
        registry.register(Method(name="medusa2", title="x", heads=dh.HydraHeads, loss=HeadLoss, drafter=print,
                                 tree=TreeKind.STATIC))
    assert registry.method_named("medusa") is medusa and "medusa2" not in registry.names()


def test_a_heads_folder_under_an_older_name_of_its_method_loads(tmp_path, tiny_llama, monkeypatch):
    """A method that renames its head type keeps the old name as an alias: folders written
    before still load, as that method's heads (config.head_type is the current name)."""
    heads = dh.MedusaHeads.for_target(tiny_llama, num_heads=2)
    folder = heads.save_pretrained(tmp_path / "heads")
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**data, "head_type": "medusa-1"}))
    with pytest.raises(ValueError, match="unknown head_type 'medusa-1'"):
        dh.load_heads(folder, target=tiny_llama)
    monkeypatch.setitem(registry._ALIASES, "medusa-1", "medusa")
    loaded = dh.load_heads(folder, target=tiny_llama)
    assert type(loaded) is dh.MedusaHeads and loaded.config.head_type == "medusa"


def test_heads_draft_with_the_drafter_their_method_declares(tiny_llama, monkeypatch):
    heads = dh.MedusaHeads.for_target(tiny_llama, num_heads=2)
    seen = []
    method = registry.method_named("medusa")
    monkeypatch.setitem(registry._METHODS, "medusa",
                        Method(**{**method.__dict__, "drafter": lambda h, tree=None, **o: seen.append((h, tree)) or "mine"}))
    assert heads.proposer(tree=[[0]]) == "mine" and seen == [(heads, [[0]])]


def test_the_training_module_calls_the_loss_its_heads_method_declares(tiny_llama, monkeypatch):
    """TargetWithHeads builds the method's loss from the run's settings and calls it with one
    signature; it never asks which method it trains."""
    from draftheads.train.model import TargetWithHeads

    calls = []

    class Recorded(HeadLoss):
        def __call__(self, heads, batch):
            calls.append((self.settings, batch))
            zero = torch.zeros(heads.config.num_heads)
            return HeadLossOutput(loss=zero.sum(), ce_sum=zero, count=zero, top1=zero, topk=zero)

        def counts(self, heads, batch):
            return torch.full((heads.config.num_heads,), 7)

    method = registry.method_named("hydra")
    monkeypatch.setitem(registry._METHODS, "hydra", Method(**{**method.__dict__, "loss": Recorded}))
    model = TargetWithHeads(tiny_llama, dh.HydraHeads.for_target(tiny_llama, num_heads=2), loss_decay=0.5,
                            loss_chunk_size=3, topk=2, labels="target", checkpoint_loss_chunks=False)
    ids = torch.randint(0, 64, (1, 9))
    assert model.loss_counts(ids).tolist() == [7, 7]
    model(input_ids=ids, rank_stats=4)
    settings, batch = calls[0]
    assert settings == LossSettings(decay=0.5, chunk_size=3, topk=2, checkpoint_chunks=False, labels="target")
    assert isinstance(batch, LossBatch) and batch.ranks == 4 and batch.hidden.shape[:2] == ids.shape
    assert torch.equal(batch.target_labels(), model.target_labels(ids, batch.hidden))


# -- nothing below methods/ branches on a method's name ------------------------------------------

PACKAGE = __import__("pathlib").Path(dh.__file__).parent
#: Strings that name a method, or one of the kinds heads used to be told apart by.
METHOD_WORDS = {*ALL, "eagle-3", "p-eagle", "future_tokens", "draft_steps", "block", "parallel_depths"}
#: Attributes whose comparison or truth value is a dispatch on the method.
PROBES = {"training_objective", "head_type", "dynamic_tree"}
#: Attributes only some head types had, probed with hasattr/getattr to tell them apart.
PROBED = {"training_objective", "dynamic_tree", "set_draft_vocab", "choose_mask_token", "resolve_options",
          "validate_loaded"}
#: Dispatch sites not moved into a method yet, per file: none left, and none may come back (a tree
#: is told apart by its typed spec, `plans.trees`, and heads by their method's declarations).
NOT_YET: dict[str, int] = {}


def method_dispatch_sites(source: str) -> list[int]:
    """Lines of ``source`` that dispatch on a method by name: a comparison with a method's name (or
    an old objective name), a comparison or test of ``head_type`` / ``training_objective`` /
    ``dynamic_tree``, ``isinstance(<tree>, dict)`` (the untyped tree telling EAGLE apart) and
    ``hasattr`` / ``getattr`` of an attribute only some head types have (``set_draft_vocab``...)."""
    import ast

    def strings(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value.lower()
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            for e in node.elts:
                yield from strings(e)

    def names(node):
        return {n.attr if isinstance(n, ast.Attribute) else n.id
                for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Name))}

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if {s for o in operands for s in strings(o)} & METHOD_WORDS or set().union(*map(names, operands)) & PROBES:
                lines.append(node.lineno)
        elif isinstance(node, (ast.If, ast.IfExp)):
            test = node.test.operand if isinstance(node.test, ast.UnaryOp) else node.test
            if isinstance(test, ast.Attribute) and test.attr in PROBES:
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2:
            if node.func.id == "isinstance" and isinstance(node.args[1], ast.Name) and node.args[1].id == "dict" \
                    and any("tree" in n for n in names(node.args[0])):
                lines.append(node.lineno)
            if node.func.id in ("hasattr", "getattr") and set(strings(node.args[1])) & PROBED:
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) == 3 and set(strings(node.args[1])) & PROBED:
            lines.append(node.lineno)
    return sorted(lines)


def test_no_layer_below_methods_dispatches_on_a_method_name():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("methods/") or rel == "registry.py":
            continue
        sites = method_dispatch_sites(path.read_text())
        if sites:
            found[rel] = sites
    grown = {f: lines for f, lines in found.items() if len(lines) > NOT_YET.get(f, 0)}
    assert not grown, f"dispatch on a method's name outside draftheads/methods/ (declare it on the method instead): {grown}"
    shrunk = {f: n for f, n in NOT_YET.items() if len(found.get(f, [])) < n}
    assert not shrunk, f"fewer name dispatches than NOT_YET allows (lower it): {shrunk}"


def method_name_sites(source: str, names: set[str]) -> list[tuple[int, str]]:
    """Where ``source`` holds one of ``names`` as a value, not as prose: a string without spaces (a
    default, a key, a path such as "runs/medusa", a layout name) or an identifier, one of whose
    words (split at anything but letters and digits) is a name. Docstrings, and messages or help
    texts that describe the methods in sentences, are prose."""
    import ast
    import re

    def words(text: str) -> set[str]:
        return set(re.split(r"[^a-z0-9]+", text.lower()))

    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if not re.search(r"\s", node.value) and words(node.value) & names:
                found.append((node.lineno, node.value))
        elif isinstance(node, (ast.Name, ast.Attribute, ast.arg, ast.FunctionDef, ast.ClassDef)):
            name = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "arg", None) or node.name
            if words(name) & names:
                found.append((node.lineno, name))
    return sorted(found)


def test_no_code_below_methods_names_a_method():
    """A method's facts live on its `Method` (its package under draftheads/methods/): the default head
    type, its layouts' names and config marks too. Outside methods/, only the registry and the
    package root (the public names) may name one."""
    names = {n for m in registry.methods() for n in (m.name, *m.aliases)}
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith("methods/") and rel not in ("registry.py", "__init__.py"):
            sites = method_name_sites(path.read_text(), names)
            if sites:
                found[rel] = sites
    assert found == {}


def test_the_name_finder_sees_values_and_identifiers_not_prose():
    source = '''"""Medusa heads, and EAGLE: a docstring."""
head_type = "medusa"
folder = "runs/medusa"
marks = ("eagle", "x")
key = "medusa_num_heads"
def draft_eagle(x): pass
message = f"EAGLE heads take a dynamic tree: {x}"
flag = "--speculators"
'''
    assert [line for line, _ in method_name_sites(source, {"medusa", "eagle"})] == [2, 3, 4, 5, 6]


def test_the_dispatch_finder_sees_each_kind_of_name_branch():
    source = '''
if heads.training_objective == "block": pass
if kind in ("medusa", "hydra"): pass
x = 1 if heads.dynamic_tree else 2
if isinstance(heads.tree, dict): pass
if hasattr(heads, "set_draft_vocab"): pass
if layout == "speculators": pass
if getattr(heads, "dynamic_tree", False): pass
resolve = getattr(cls, "resolve_options", None)
'''
    assert method_dispatch_sites(source) == [2, 3, 4, 5, 6, 8, 9]


def test_a_one_forward_method_must_declare_its_search_measurements():
    """Training's tree choice and calibrate ask the method how to measure a one-forward tree (no
    branch on its objective below methods/), so a method of that kind without them is refused."""
    from draftheads.registry import OneForwardSearch, register

    class Heads:
        head_type = "one-forward-without-search"

    bare = Method(name=Heads.head_type, title="x", heads=Heads, loss=None, drafter=None, tree=TreeKind.ONE_FORWARD)
    with pytest.raises(ValueError, match="needs one_forward search measurements"):
        register(bare)
    search = OneForwardSearch(draft_seconds=lambda heads, vocab: {}, accuracy=lambda *a: None)
    static = Method(name=Heads.head_type, title="x", heads=Heads, loss=None, drafter=None, tree=TreeKind.STATIC,
                    one_forward=search)
    with pytest.raises(ValueError, match="takes no one_forward search measurements"):
        register(static)
    for m in registry.methods():
        assert (m.tree is TreeKind.ONE_FORWARD) == (m.one_forward is not None), m.name


def test_every_methods_heads_and_drafter_live_in_a_method_package():
    """A head type has one home: its heads class and its drafter are defined under
    draftheads/methods/ (EAGLE-3 drafts with EAGLE's drafter, so that one is EAGLE's), and no
    module of the shared layers defines a class of one method."""
    for method in registry.methods():
        assert method.heads.__module__ == f"draftheads.methods.{method.name}.heads", method
        assert method.drafter.__module__.startswith("draftheads.methods."), method
    shared = [path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
              if not path.relative_to(PACKAGE).as_posix().startswith("methods/")
              and any(f"class {m.heads.__name__}(" in path.read_text() for m in registry.methods())]
    assert shared == []


@pytest.mark.parametrize("package, name, expected", [
    ("draftheads.heads", "MedusaHeads", "MedusaHeads"),
    ("draftheads.heads", "Eagle3Head", "Eagle3Head"),
    ("draftheads.heads", "ResBlock", "ResBlock"),
    ("draftheads.inference", "PEagleDrafter", "PEagleDrafter"),
    ("draftheads.inference", "MedusaProposer", "MedusaDrafter"),
    ("draftheads.inference.proposers", "DFlashDrafter", "DFlashDrafter"),
    ("draftheads.inference.proposers", "EagleProposer", "EagleDrafter"),
])
def test_a_class_read_from_its_former_package_is_found_with_a_deprecation(package, name, expected):
    import importlib

    module = importlib.import_module(package)
    with pytest.warns(DeprecationWarning, match=rf"{package}\.{name} is deprecated: import {expected} from draftheads\.methods\."):
        found = getattr(module, name)
    assert found.__name__ == expected and found.__module__.startswith("draftheads.methods.")
    if hasattr(dh, expected):
        assert found is getattr(dh, expected)


def test_a_name_no_package_ever_had_is_still_an_attribute_error():
    import draftheads.heads
    import draftheads.inference

    for module in (draftheads.heads, draftheads.inference):
        with pytest.raises(AttributeError, match="has no attribute 'NoSuchHeads'"):
            module.NoSuchHeads
        with pytest.raises(AttributeError, match="has no attribute 'DraftLayer'"):
            module.DraftLayer  # imported by EAGLE's heads module, defined in heads/draft_layer.py: never a moved name
        assert not hasattr(module, "_private")
