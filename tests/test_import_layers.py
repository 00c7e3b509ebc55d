"""No import circles and no import against the layer order (docs/layout.md), found from the source.

The checker (tests/import_graph.py) counts deferred imports inside functions and `if TYPE_CHECKING:`
imports alike. bench/ sits on top (it measures the code, nothing imports it); tests are not walked.
"""

from __future__ import annotations

import ast
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


# training/'s rooms, lowest first (docs/layout.md draws them; each room's __init__.py says what it owns).
# A room imports only rooms below it; the package's face (training/__init__.py, __main__.py, prepare.py)
# is above them all and nothing in a room imports it.
ROOMS = [
    "common",
    "chat",
    "model",
    "sizing",
    "data",
    "methods",
    "reporting",
    "network",
    "options",
    "checkpoint",
    "export",
    "run",
]


def _room(module: str) -> str | None:
    """The room of a training module (None for the package's face)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ROOMS) else None


@pytest.fixture(scope="module")
def training_edges():
    return edges(modules(ROOT, ["training"]))


def test_every_training_module_lives_in_a_room(training_edges):
    found = modules(ROOT, ["training"])
    rooms = {_room(m) for m in found} - {None}
    assert rooms == set(ROOMS)
    face = sorted(m for m in found if _room(m) is None)
    assert face == ["training", "training.__main__", "training.prepare"]
    for room in ROOMS:
        tree = ast.parse((ROOT / "training" / room / "__init__.py").read_text())
        doc = ast.get_docstring(tree) or ""
        # A docstring and nothing else: importing a torch-free module of a room stays torch-free.
        assert len(tree.body) == 1 and "import" in doc.lower(), (
            f"training/{room}/__init__.py: its docstring only"
        )


def test_training_rooms_import_one_way(training_edges):
    rank = {room: i for i, room in enumerate(ROOMS)}
    against = []
    for e in training_edges:
        src, dst = _room(e.importer), _room(e.imported)
        if dst is None and e.imported != "training":
            against.append(f"{e} (the package's face)")
        elif src is not None and dst is not None and rank[dst] > rank[src]:
            against.append(f"{e} ({src} is below {dst})")
    assert against == []


def test_rooms_checker_finds_an_import_back_up(tmp_path):
    root = _package(
        tmp_path,
        {
            "training/__init__.py": "",
            "training/common/__init__.py": "",
            "training/common/errors.py": "from training.run import driver\n",
            "training/run/__init__.py": "",
            "training/run/driver.py": "from training.common.errors import X\n",
        },
    )
    found = edges(modules(root, ["training"]))
    rank = {room: i for i, room in enumerate(ROOMS)}
    back = [e for e in found if rank[_room(e.imported)] > rank[_room(e.importer)]]
    assert [str(e) for e in back] == ["training.common.errors (line 1) imports training.run.driver"]
    assert cycles(found) == [["training.common.errors", "training.run.driver"]]


def test_layout_doc_draws_the_rooms_in_order():
    text = (ROOT / "docs" / "layout.md").read_text().partition("## training/'s rooms")[2]
    positions = [text.find(f"`training/{room}/`") for room in ROOMS]
    assert -1 not in positions, "docs/layout.md names every room as `training/ROOM/`"
    assert positions == sorted(positions), "docs/layout.md lists the rooms lowest first"
