"""The package stays readable in pieces: no function over 80 lines, no class over 220."""
import ast

from tests.helpers import REPO


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
