"""The package stays readable in pieces: its top level holds only the user's entry points and the
config, every other module lives in the folder of its role, no module is over 450 lines, no
function over 80, no class over 220, and no chain of modules importing one another is deeper than 10."""
import ast
import functools

from tests.helpers import REPO

PACKAGE = REPO / "hogwild_a3c"
MAX_IMPORT_DEPTH = 10  # modules on the longest chain, the deepest counted as 1
ENTRY_POINTS_AND_CONFIG = {"__init__", "train", "evaluate", "plot", "api", "config"}
ROOMS = {"learning", "acting", "envs", "children", "run", "files", "nodes"}


def modules() -> dict[str, object]:
    """Every module of the package by dotted name relative to it ("learning.model")."""
    found = {".".join(path.relative_to(PACKAGE).with_suffix("").parts): path for path in PACKAGE.rglob("*.py")}
    return {name.removesuffix(".__init__"): path for name, path in found.items()}


def test_the_walk_sees_every_room():
    rooms = {name.split(".")[0] for name in modules() if "." in name}
    assert rooms == ROOMS
    assert len(modules()) > 40


def test_the_top_level_holds_only_entry_points_and_the_config():
    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top == ENTRY_POINTS_AND_CONFIG
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == ROOMS | {"presets"}  # presets/: the JSON files users read


def test_no_module_over_450_lines():
    too_long = [f"{name}: {len(path.read_text().splitlines())} lines" for name, path in sorted(modules().items())
                if len(path.read_text().splitlines()) > 450]
    assert not too_long, "\n".join(too_long)


def test_no_function_over_80_lines_and_no_class_over_220():
    too_long = []
    for name, path in sorted(modules().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = 220 if isinstance(node, ast.ClassDef) else 80
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    too_long.append(f"{name}: {node.name} has {lines} lines (at most {limit})")
    assert not too_long, "\n".join(too_long)


def imported_module(importer: str, is_package: bool, node: ast.ImportFrom, alias: str, known: set[str]) -> str | None:
    """The package module that `from <level dots><module> import <alias>` in `importer` reads, or None."""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    target = ".".join([*base, *(node.module.split(".") if node.module else [])])
    deeper = f"{target}.{alias}" if target else alias
    if deeper in known:  # `from . import worker`: the module itself
        return deeper
    return target if target in known else None


def package_imports() -> dict[str, set[str]]:
    """Each module's imports of the package's other modules: every relative import, at the top,
    inside a function or for type checking only, since a reader follows each of them."""
    found_modules = modules()
    known = set(found_modules)
    imports = {}
    for name, path in found_modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                for alias in node.names:
                    target = imported_module(name, path.name == "__init__.py", node, alias.name, known)
                    if target is not None:
                        found.add(target)
        imports[name] = {module for module in found if module != name and module != ""}
    return imports


def test_imports_are_resolved_across_rooms():
    imports = package_imports()
    assert "learning.model" in imports["children.worker"]
    assert "children.shared" in imports["children.worker"]
    assert "config" in imports["children.worker"]


def longest_chain(imports: dict[str, set[str]]) -> list[str]:
    @functools.cache
    def chain_from(module: str, seen: frozenset = frozenset()) -> tuple[str, ...]:
        below = [chain_from(other, seen | {module}) for other in imports[module] if other not in seen | {module}]
        return (module, *max(below, key=len, default=()))

    return list(max((chain_from(module) for module in imports), key=len))


def test_longest_chain_is_measured_as_drawn():
    drawn = {"a": {"b", "c"}, "b": {"d"}, "c": set(), "d": {"a"}}  # a cycle through a is cut, not followed
    assert longest_chain(drawn) == ["b", "d", "a", "c"]


def test_the_house_is_no_deeper_than_ten_floors():
    chain = longest_chain(package_imports())
    assert len(chain) <= MAX_IMPORT_DEPTH, f"{len(chain)} modules deep: {' -> '.join(chain)}"
