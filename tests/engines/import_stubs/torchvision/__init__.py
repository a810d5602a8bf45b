"""An import-only stand-in for torchvision, for vLLM's CPU venv (tests/test_vllm_mtp.py puts it on the path).

vLLM's Qwen3.5 model file imports its vision sibling (qwen3_vl.py), whose image processors import
torchvision at module level; the CPU venv has none (scripts/setup_vllm_env.sh removes the CUDA build
pip pulls in, which breaks ``import vllm``). A text-only model never calls it: every submodule and
name exists here, and using one raises."""
import importlib.abc, importlib.machinery, sys, types

__version__ = "0.0.0"


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls


class _Missing(metaclass=_Meta):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("torchvision is not installed (an import-only stand-in is)")


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__path__ = []
def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing
