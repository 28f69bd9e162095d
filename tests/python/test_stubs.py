"""The type stubs (python/distca/*.pyi) against the compiled module: every name, method and
property they declare exists, every function's parameters match pybind11's own signature
(names, order, keyword-only marker), and the package exports what its stub says."""

import ast
import inspect
import os
import re

import distca
from distca import _distca

STUBS = os.path.join(os.path.dirname(distca.__file__), "_distca.pyi")


def stub_params(fn):
    a = fn.args
    names = [x.arg for x in a.args if x.arg != "self"]
    if a.kwonlyargs:
        names += ["*"] + [x.arg for x in a.kwonlyargs]
    return names


def runtime_params(obj):
    """Parameter names from pybind11's signature line ("name(a: T, *, b: U = 1) -> R")."""
    first = obj.__doc__.splitlines()[0]
    inside = first[first.index("(") + 1:first.rindex(") ->")]
    depth, cur, parts = 0, "", []
    for ch in inside:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    names = [re.split(r"[:=]", p.strip())[0].strip() for p in parts]
    return [n for n in names if n != "self"]


def test_stub_functions_and_classes_match():
    tree = ast.parse(open(STUBS).read())
    checked = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            assert stub_params(node) == runtime_params(getattr(_distca, node.name)), node.name
            checked += 1
        elif isinstance(node, ast.ClassDef):
            cls = getattr(_distca, node.name)
            for item in node.body:
                if not isinstance(item, ast.FunctionDef):
                    continue
                assert hasattr(cls, item.name), f"{node.name}.{item.name}"
                member = inspect.getattr_static(cls, item.name)
                is_prop = any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list)
                assert is_prop == isinstance(member, property), f"{node.name}.{item.name}"
                if not is_prop and item.name not in ("__init__", "__eq__"):
                    assert stub_params(item) == runtime_params(getattr(cls, item.name)), f"{node.name}.{item.name}"
                checked += 1
            for item in node.body:  # annotated attributes (ModelSpec's fields)
                if isinstance(item, ast.AnnAssign):
                    assert hasattr(cls, item.target.id), f"{node.name}.{item.target.id}"
    assert checked > 40


def test_package_exports():
    tree = ast.parse(open(os.path.join(os.path.dirname(distca.__file__), "__init__.pyi")).read())
    names = [a.asname for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names]
    assert sorted(names) == sorted(n for n in distca.__all__ if n != "EXCHANGES")
    for n in distca.__all__:
        assert hasattr(distca, n)
        if callable(getattr(distca, n)):
            assert getattr(distca, n).__doc__, f"{n} has a docstring"
