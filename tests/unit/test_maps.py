"""The maps of the code cannot go stale: README's Layout names every module of the three
product packages, the hub's package docstring names every room of the hub, and every relative
link in README.md and docs/ points at a file that exists."""

import re
from pathlib import Path

import cellscale_hub

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kernels/cellscale/", "hub/cellscale_hub/", "extension/cellscale_server/")
PATH_TOKEN = re.compile(r"[\w./-]+(?:\.py|/)")


def layout_block() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1].splitlines()


def product_modules(package: str) -> list[str]:
    """Each module's path relative to its package, migrations left out (Alembic's versions
    are named by the migrations' own docstrings)."""
    base = ROOT / package
    found = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).as_posix()
        if "migrations/" in rel or path.name == "__init__.py" and rel == "__init__.py":
            continue
        found.append(rel)
    return found


def named_in_layout(lines: list[str], package: str) -> set[str]:
    """The paths (relative to `package`) the layout names under that package's line.

    A line whose first word is a folder (`drivers/`) opens it: the names on that line and on
    the more indented lines below it are inside the folder (`drivers/` then `base.py` is
    `drivers/base.py`); `slurm/__init__.py` counts as named when `slurm/` is."""
    start = next(i for i, line in enumerate(lines) if line.startswith(package))
    named: set[str] = set()
    scopes: list[tuple[int, str]] = [(-1, "")]
    for line in lines[start:]:
        if line and not line[0].isspace() and not line.startswith(package):
            break
        body = line.removeprefix(package) if line.startswith(package) else line
        indent = len(line) - len(line.lstrip()) if not line.startswith(package) else -1
        words = body.split()
        if not words:
            continue
        while len(scopes) > 1 and scopes[-1][0] >= indent:
            scopes.pop()
        here = scopes[-1][1]
        if words[0].endswith("/") and indent >= 0:
            here = here + words[0]
            scopes.append((indent, here))
            named.add(here)
        for token in PATH_TOKEN.findall(body):
            if token.endswith("/") and token == words[0] and indent >= 0:
                continue
            named.add(here + token if not token.startswith(here) else token)
    return named


def is_named(module: str, named: set[str]) -> bool:
    if module in named:
        return True
    if module.endswith("/__init__.py"):
        return module.removesuffix("__init__.py") in named
    return False


def test_the_readme_layout_names_every_module():
    lines = layout_block()
    missing = []
    for package in PACKAGES:
        named = named_in_layout(lines, package)
        missing += [package + m for m in product_modules(package) if not is_named(m, named)]
    assert not missing, "README.md's Layout does not name: " + ", ".join(missing)


def test_the_hub_map_names_every_room():
    doc = cellscale_hub.__doc__
    hub = ROOT / "hub/cellscale_hub"
    rooms = [p.name + "/" for p in hub.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    rooms += [p.name for p in hub.glob("*.py") if p.name != "__init__.py"]
    missing = [room for room in sorted(rooms) if not re.search(rf"(?<![\w/]){re.escape(room)}", doc)]
    assert not missing, "cellscale_hub/__init__.py's map does not name: " + ", ".join(missing)


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert not broken, "broken links: " + ", ".join(broken)
