"""No import circles and no import against the layer order (docs/layout.md), found from the source.

The checker (tests/import_graph.py) counts deferred imports inside functions and `if TYPE_CHECKING:`
imports alike. bench/ sits on top (it measures the code, nothing imports it); tests are not walked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import against_layers, cycles, edges, modules

ROOT = Path(__file__).resolve().parents[1]
# Lowest first: a package may import only from layers below its own.
# cdk_constructs and k8s are one layer in docs/layout.md but never import each other.
LAYERS = [{"training"}, {"config"}, {"cdk_constructs", "k8s"}, {"stacks"}, {"raytrain", "app"}, {"bench"}]
PACKAGES = sorted(set().union(*LAYERS))
GENERATED = ("k8s.imports",)  # `cdk8s import`'s classes


@pytest.fixture(scope="module")
def project_edges():
    found = modules(ROOT, PACKAGES, exclude=GENERATED)
    assert {"training.options.train", "config.memory", "raytrain.job.api", "app"} <= set(found)
    return edges(found)


def test_no_import_circles(project_edges):
    assert cycles(project_edges) == []


def test_no_import_against_the_layers(project_edges):
    assert [str(e) for e in against_layers(project_edges, LAYERS)] == []


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_finds_a_circle_through_a_deferred_and_a_type_only_import(tmp_path):
    root = _package(
        tmp_path,
        {
            "low/__init__.py": "",
            "low/a.py": "from low import b\n",
            "low/b.py": "def f():\n    from .c import X\n",
            "low/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from low.a import Y\n",
            "low/d.py": "import low.a\n",
        },
    )
    assert cycles(edges(modules(root, ["low"]))) == [["low.a", "low.b", "low.c"]]


def test_checker_finds_an_import_up_the_layers_and_between_siblings(tmp_path):
    root = _package(
        tmp_path,
        {
            "low/__init__.py": "",
            "low/x.py": "def f():\n    from high.y import Z\n",
            "mid1/__init__.py": "import low.x\n",
            "mid2/__init__.py": "from mid1 import thing\n",
            "high/__init__.py": "",
            "high/y.py": "import low\nfrom mid2 import q\n",
        },
    )
    found = edges(modules(root, ["low", "mid1", "mid2", "high"]))
    bad = against_layers(found, [{"low"}, {"mid1", "mid2"}, {"high"}])
    assert sorted(str(e) for e in bad) == [
        "low.x (line 2) imports high.y",
        "mid2 (line 1) imports mid1",
    ]
    # The upward import closes a circle as well.
    assert cycles(found) == [["high.y", "low.x", "mid1", "mid2"]]
