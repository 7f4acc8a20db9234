"""The packages depend one way: every import in lit_credit/, data_modules/ and callbacks/ points down the layers.

The layers, bottom to top (docs/design.md, "Layers"). A unit is a subpackage of ``lit_credit`` (``credit``), a
top-level module of it (``types``), or one of the two sibling packages. A unit may import itself and any unit of
a LOWER layer; never a higher one, and never another unit of its own layer. Every import counts: module level,
inside functions, and under ``if TYPE_CHECKING:`` alike (an import that only a type checker runs still ties the
packages together). A few downward edges are forbidden as well (``FORBIDDEN``): the policy, the sampling and the
methods never import a task; what they need of one comes through ``interfaces`` and ``types``.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lit_credit", "data_modules", "callbacks")

LAYERS: list[tuple[str, ...]] = [
    ("__init__", "types", "backends", "checkpoint", "config", "quiet"),  # records, retries, checkpoint I/O, quiet run
    ("distributed",),  # several processes, one run: launch ranks, the run directory's claim, shares, gathers
    ("interfaces",),  # the Protocols of every layer (RolloutEngine, Environment, Reward, CreditEstimator, ...)
    ("credit", "losses"),  # pure tensor math: advantage estimators, policy losses
    ("rewards",),  # scoring of replies, and the parsers of what a reply says
    ("tasks",),  # prompts, environments, demonstrations, the tool world and its prompt text
    ("models",),  # the policy: loading, tokenizer, chat codec, log-probs, SFT warm start
    ("rollout",),  # sampling: engines, the episode loop, a frozen model as a text function
    ("analysis",),  # credit records, their loader, plots and report
    ("data_modules", "callbacks"),  # Lightning data module (rollouts per step), callbacks
    ("methods",),  # the LightningModules: the algorithms
    ("emulation",),  # GPU mistakes caught on CPU: the checking device, inference-mode evaluation, collectives
    ("train", "cli"),  # entry points
]
LAYER = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}

# (importing unit, imported unit): why this upward or sideways edge is tolerated for now. Keep it empty.
ALLOWED: dict[tuple[str, str], str] = {}

# (importing unit, imported unit): why this edge is forbidden although it points down the layers.
FORBIDDEN: dict[tuple[str, str], str] = {
    ("models", "tasks"): "the codec and the embedded template take the task's ToolPrompt, the warm start reads "
                         "Demonstrations (interfaces), handed in by the data module and the config",
    ("rollout", "tasks"): "role batches are built from the game types in lit_credit.types (Action, RoleActions)",
    ("methods", "tasks"): "a method reads a game's round as a lit_credit.types.GameRecord (interfaces.Game.play)",
}


def unit_of_file(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    if rel[0] != "lit_credit":
        return rel[0]
    return rel[1].removesuffix(".py") if len(rel) > 1 else "__init__"


def unit_of_module(name: str) -> str | None:
    """The unit of an absolute module name, None for a module outside the three packages."""
    parts = name.split(".")
    if parts[0] in ("data_modules", "callbacks"):
        return parts[0]
    if parts[0] != "lit_credit":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(tree: ast.AST, path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``tree``; ``from lit_credit import x`` names
    ``lit_credit.x``, and a relative import is resolved against the file's package."""
    package = list(path.relative_to(ROOT).with_suffix("").parts)
    if package[-1] != "__init__":
        package = package[:-1]
    else:
        package = package[:-1] or package
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base in PACKAGES:
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
    return found


def edges_against_layers() -> list[tuple[str, str, str]]:
    """``(importing unit, imported unit, message)`` for every import that does not point down."""
    bad = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel, source = path.relative_to(ROOT), unit_of_file(path)
            if source not in LAYER:
                bad.append((source, "", f"{rel}: unit {source!r} is in no layer; add it to LAYERS"))
                continue
            for line, module in imported_modules(ast.parse(path.read_text(), str(path)), path):
                target = unit_of_module(module)
                if target is None or target == source:
                    continue
                if target not in LAYER:
                    bad.append((source, target, f"{rel}:{line}: imports {module} (unit {target!r} is in no "
                                                "layer; add it to LAYERS)"))
                elif LAYER[target] >= LAYER[source]:
                    where = "a higher" if LAYER[target] > LAYER[source] else "the same"
                    bad.append((source, target, f"{rel}:{line}: {source} (layer {LAYER[source]}) imports "
                                                f"{module} ({target}: {where} layer, {LAYER[target]})"))
    return bad


def test_every_import_points_down_the_layers():
    bad = [message for source, target, message in edges_against_layers() if (source, target) not in ALLOWED]
    assert not bad, "imports against the layering (docs/design.md, Layers):\n" + "\n".join(bad)


def test_forbidden_edges_are_absent():
    """No import of lit_credit.tasks from lit_credit/models, lit_credit/rollout or lit_credit/methods."""
    bad = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = unit_of_file(path)
            for line, module in imported_modules(ast.parse(path.read_text(), str(path)), path):
                target = unit_of_module(module)
                if (source, target) in FORBIDDEN:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {source} imports {module} "
                               f"({FORBIDDEN[source, target]})")
    assert not bad, "imports on a forbidden edge (docs/design.md, Layers):\n" + "\n".join(bad)


def test_forbidden_edges_point_down_the_layers():
    """An edge the layers already forbid does not belong in FORBIDDEN."""
    redundant = sorted(edge for edge in FORBIDDEN if LAYER[edge[1]] >= LAYER[edge[0]])
    assert not redundant, f"FORBIDDEN edges the layer order already forbids, remove them: {redundant}"


def test_allow_list_names_only_edges_that_exist():
    """An allowed edge that the code no longer has must leave the list, so the list only shrinks."""
    present = {(source, target) for source, target, _ in edges_against_layers()}
    stale = sorted(set(ALLOWED) - present)
    assert not stale, f"ALLOWED edges no longer in the code, remove them: {stale}"


def test_checker_sees_function_level_and_type_checking_imports(tmp_path):
    """The walk finds imports inside functions and under TYPE_CHECKING, and resolves relative ones."""
    code = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lit_credit.methods import GRPOModule\n"
            "def f():\n    from lit_credit import rollout\n    from .engine import HFEngine\n")
    fake = ROOT / "lit_credit" / "rollout" / "x.py"
    found = imported_modules(ast.parse(code), fake)
    assert (3, "lit_credit.methods") in found and (5, "lit_credit.rollout") in found
    assert (6, "lit_credit.rollout.engine") in found
    assert [unit_of_module(m) for _, m in found[1:]] == ["methods", "rollout", "rollout"]


def unit_imports() -> dict[str, set[str]]:
    """Every unit's imported units (other than itself), measured from the code as the checks above read it."""
    found: dict[str, set[str]] = {unit: set() for unit in LAYER}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = unit_of_file(path)
            for _, module in imported_modules(ast.parse(path.read_text(), str(path)), path):
                target = unit_of_module(module)
                if target is not None and target != source:
                    found.setdefault(source, set()).add(target)
    return found


def picture() -> str:
    """The layers as docs/design.md draws them, from the code: each unit, top layer first, with the units it
    imports (all of a lower layer, the checks above hold that), and the downward edges that are forbidden."""
    imports = unit_imports()
    width = max(len(unit) for unit in LAYER)
    lines = ["layer  unit" + " " * (width - 3) + "imports (units of lower layers only)"]
    for depth in range(len(LAYERS) - 1, -1, -1):
        for unit in LAYERS[depth]:
            if unit == "__init__":
                continue
            lines.append(f"{depth:>5}  {unit:<{width}}  {', '.join(sorted(imports.get(unit, ()))) or '-'}")
    forbidden = ", ".join(f"{a} -> {b}" for a, b in sorted(FORBIDDEN))
    return "\n".join([*lines, "", f"forbidden although downward: {forbidden}"])


PICTURE_BEGIN, PICTURE_END = "<!-- layers: python -m tests.test_layering -->\n```\n", "\n```\n<!-- layers end -->"


def test_design_doc_draws_the_layers_of_the_code():
    """docs/design.md's layer picture is :func:`picture` of today's code (regenerate: python -m tests.test_layering)."""
    text = (ROOT / "docs" / "design.md").read_text()
    assert PICTURE_BEGIN in text and PICTURE_END in text, "docs/design.md has no layer picture between the markers"
    drawn = text.split(PICTURE_BEGIN, 1)[1].split(PICTURE_END, 1)[0]
    assert drawn == picture(), "docs/design.md's layer picture is stale: run python -m tests.test_layering"


if __name__ == "__main__":  # rewrite docs/design.md's layer picture from the code
    design = ROOT / "docs" / "design.md"
    head, rest = design.read_text().split(PICTURE_BEGIN, 1)
    design.write_text(head + PICTURE_BEGIN + picture() + PICTURE_END + rest.split(PICTURE_END, 1)[1])
    print(picture())
