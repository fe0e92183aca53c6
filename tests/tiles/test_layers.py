"""The package's layers, read from the source with ``ast`` (every import, function-level ones and
``importlib.import_module`` / ``__import__`` of a literal name included):

* ``tilecore.tiles`` imports nothing of ``tilecore.ops`` (tiles are what ops are written with);
* ``tilecore.napkin`` imports no torch or triton (it is pure Python, and says so);
* no import loops among tilecore's modules (a module's own parent packages aside);
* device questions (is this the interpreter, the compute capability, the device's properties) are
  answered by ``tilecore.dispatch`` only: no other module reads TRITON_INTERPRET or the environment
  for it, calls torch.cuda.get_device_capability / get_device_properties, or derives an
  ``interpret`` flag from a tensor's device;
* the GPU probes in experiments/ reach tilecore through its public or documented entry points:
  they import no private (underscore) name of it and assign no attribute of it (no monkeypatching).
"""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tilecore"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of every import in ``path``, relative ones resolved."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out.append((base, [a.name for a in node.names], node.lineno))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                   or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"))):
            out.append((node.args[0].value, [], node.lineno))
    return out


def _targets(module: str, names: list[str]) -> set[str]:
    """The tilecore modules an import reaches: ``from a.b import c`` reaches a.b.c if that is a module."""
    out = set()
    for name in names or [""]:
        full = f"{module}.{name}" if name else module
        while full and full not in MODULES:
            full = full.rpartition(".")[0]
        if full:
            out.add(full)
    return out


def test_tiles_import_nothing_of_ops():
    bad = [f"{_rel(p)}:{line} imports {module}" for p in sorted((PACKAGE / "tiles").rglob("*.py"))
           for module, names, line in _imports(p)
           if module == "tilecore.ops" or module.startswith("tilecore.ops.")
           or (module == "tilecore" and any(n == "ops" for n in names))]
    assert not bad, "tilecore.tiles must not import tilecore.ops:\n" + "\n".join(bad)


NAPKIN_FREE_OF = ("torch", "triton")


def test_napkin_imports_no_torch_or_triton():
    bad = []
    for p in sorted((PACKAGE / "napkin").rglob("*.py")):
        for module, names, line in _imports(p):
            top = module.split(".")[0]
            reached = _targets(module, names) if top == "tilecore" else set()
            if top in NAPKIN_FREE_OF or any(not m.startswith("tilecore.napkin") and m != "tilecore" for m in reached):
                bad.append(f"{_rel(p)}:{line} imports {module} {names or ''}")
    assert not bad, "tilecore.napkin imports only the standard library (and matplotlib, lazily):\n" + "\n".join(bad)
    # and at run time: every napkin module imported, no torch or triton loaded
    names = [m for m in MODULES if m.startswith("tilecore.napkin")]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in names)
            + f"print(sorted(m for m in {NAPKIN_FREE_OF!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout


# Loops left to work in progress, each with who removes it (an entry that no longer loops allows nothing).
ALLOWED_LOOPS = [
    # (session 32: the hadamard loop kron -> quantize.gluon_wide_transform -> kron is gone: the STORE plan and the
    # Gluon launches moved to tilecore/ops/hadamard/gluon_launch.py, which imports neither)
]


def _import_graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        reached = set()
        for imported, names, _ in _imports(path):
            if imported.split(".")[0] == "tilecore":
                reached |= _targets(imported, names)
        # a module's parent packages run first whatever it imports: not a loop
        graph[module] = {m for m in reached if m != module and not module.startswith(m + ".")}
    return graph


def test_no_import_loops():
    loops = _strongly_connected(_import_graph())
    unexplained = [sorted(c) for c in loops if set(c) not in ALLOWED_LOOPS]
    assert not unexplained, "import loops (each module reaches the others back):\n" + "\n".join(
        " <-> ".join(c) for c in unexplained)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one module."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


# Environment variables a module other than dispatch.py may read, by file.
ENV_READS = {"tilecore/env.py": {"TILECORE_COMMIT"}}  # the commit a copied tree ran, for results' metadata
DEVICE_QUERIES = ("get_device_capability", "get_device_properties")
# Files that still derive "is this the interpreter" from a tensor's device themselves (drop an entry
# once its file asks dispatch).
INTERPRET_DERIVED: set[str] = set()


def _is_environ(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _env_keys(tree) -> list[tuple[object, int]]:
    """(key or None if not a literal, line) of every read of os.environ / os.getenv."""
    out, seen = [], set()
    literal = lambda n: n.value if isinstance(n, ast.Constant) else None
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            out.append((literal(node.slice), node.lineno))
            seen.add(id(node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr in ("get", "__getitem__", "__contains__") and _is_environ(f.value)) or \
                    (f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os"):
                out.append((literal(node.args[0]) if node.args else None, node.lineno))
                seen.add(id(f.value))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            out.append((literal(node.left), node.lineno))
            seen.update(id(c) for c in node.comparators)
    for node in ast.walk(tree):  # os.environ used any other way (passed on, copied, iterated)
        if _is_environ(node) and id(node) not in seen:
            out.append((None, node.lineno))
    return out


def _inspects_device(node) -> bool:
    return any(isinstance(n, ast.Attribute) and (n.attr == "is_cuda" or (n.attr == "type" and isinstance(
        n.value, ast.Attribute) and n.value.attr == "device")) for n in ast.walk(node))


def _interpret_derivations(tree) -> list[int]:
    """Lines where an ``interpret`` flag (a name, a keyword, a ``*_config`` argument) is computed
    from a tensor's device instead of asked of dispatch."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.startswith("interpret")
                                                for t in node.targets) and _inspects_device(node.value):
            out.append(node.lineno)
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            values = [k.value for k in node.keywords if (k.arg or "").startswith("interpret")]
            values += node.args if name.endswith("_config") else []
            if any(_inspects_device(v) for v in values):
                out.append(node.lineno)
    return out


def test_device_questions_are_answered_by_dispatch():
    bad = []
    for module, path in MODULES.items():
        rel = _rel(path)
        if rel == "tilecore/dispatch.py" or rel.startswith("tilecore/napkin/"):
            continue
        tree = ast.parse(path.read_text(), rel)
        for key, line in _env_keys(tree):
            if key not in ENV_READS.get(rel, ()):
                bad.append(f"{rel}:{line} reads the environment ({key!r}): ask tilecore.dispatch")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in DEVICE_QUERIES:
                bad.append(f"{rel}:{node.lineno} calls {node.attr}: ask tilecore.dispatch")
        if rel not in INTERPRET_DERIVED:
            bad += [f"{rel}:{line} derives 'interpret' from a device: use dispatch.interpreted / "
                    f"interpreter_enabled" for line in _interpret_derivations(tree)]
    assert not bad, "\n".join(bad)


EXPERIMENTS = ROOT / "experiments"


def _probe_violations(path: Path) -> list[str]:
    """Private tilecore names imported or read, and tilecore attributes assigned, in one probe."""
    rel = _rel(path)
    tree = ast.parse(path.read_text(), rel)
    aliases, out = set(), []
    private = lambda name: name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "tilecore":
                    aliases.add(a.asname or "tilecore")
                    if any(private(p) for p in a.name.split(".")):
                        out.append(f"{rel}:{node.lineno} imports {a.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tilecore":
            for a in node.names:
                aliases.add(a.asname or a.name)
                if private(a.name) or any(private(p) for p in node.module.split(".")):
                    out.append(f"{rel}:{node.lineno} imports {node.module}.{a.name}")

    def root(n):
        while isinstance(n, (ast.Attribute, ast.Subscript, ast.Call)):
            n = n.func if isinstance(n, ast.Call) else n.value
        return n.id if isinstance(n, ast.Name) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and root(node) in aliases:
            out.append(f"{rel}:{node.lineno} reads the private {node.attr}")
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, ast.Store) \
                        and root(n) in aliases:
                    out.append(f"{rel}:{node.lineno} assigns {ast.unparse(n)} (monkeypatching)")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr", "delattr") \
                and node.args and root(node.args[0]) in aliases:
            out.append(f"{rel}:{node.lineno} {node.func.id} on {ast.unparse(node.args[0])} (monkeypatching)")
    return out


def test_experiments_use_entry_points_and_patch_nothing():
    probes = sorted(EXPERIMENTS.rglob("*.py"))
    assert probes, "experiments/ holds the GPU probes"
    bad = [v for p in probes for v in _probe_violations(p)]
    assert not bad, "\n".join(bad)
