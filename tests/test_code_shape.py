"""The package stays readable in pieces: no function over 80 lines, no class over 220, and no
chain of modules importing one another deeper than 10."""
import ast
import functools

from tests.helpers import REPO

MAX_IMPORT_DEPTH = 10  # modules on the longest chain, the deepest counted as 1


def test_no_function_over_80_lines_and_no_class_over_220():
    too_long = []
    for path in sorted((REPO / "hogwild_a3c").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = 220 if isinstance(node, ast.ClassDef) else 80
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    too_long.append(f"{path.name}: {node.name} has {lines} lines (at most {limit})")
    assert not too_long, "\n".join(too_long)


def package_imports() -> dict[str, set[str]]:
    """Each module's imports of the package's other modules: every `from .x import`, at the top,
    inside a function or for type checking only, since a reader follows each of them."""
    modules = {path.stem: path for path in (REPO / "hogwild_a3c").glob("*.py")}
    imports = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found |= {node.module.split(".")[0]} if node.module else {alias.name for alias in node.names}
        imports[name] = {module for module in found if module in modules and module != name}
    return imports


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
