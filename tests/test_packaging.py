"""The packaging matches how SpecEyes is run: the image, the lock, the client alone.

What the ``speceyes`` command imports is found by walking the source with ``ast`` from
its entry point; the Dockerfile is read as Docker reads its COPY and RUN lines.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata as metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from setuptools import find_namespace_packages

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_PACKAGES = {"cli", "common", "api", "workers", "lab"}
IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError")
# pip freeze leaves these out, and so does the lock
UNLOCKED = {"pip", "setuptools", "wheel", "distribute", "speceyes", "speceyes-client"}


# -- the project's own description --------------------------------------------------------
@cache
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@cache
def package_dirs() -> dict[str, Path]:
    """Every top-level package the distribution ships -> its folder (setuptools' rules)."""
    find = pyproject()["tool"]["setuptools"]["packages"]["find"]
    found: dict[str, Path] = {}
    for where in find.get("where", ["."]):
        for name in find_namespace_packages(str(ROOT / where), include=find["include"]):
            top = name.split(".")[0]
            found.setdefault(top, (ROOT / where / top).relative_to(ROOT))
    return found


def module_file(name: str) -> Path | None:
    """The source of a first-party module (or package), None if not ours."""
    top, *rest = name.split(".")
    folder = package_dirs().get(top)
    if folder is None:
        return None
    path = ROOT / folder / Path(*rest) if rest else ROOT / folder
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return path if path.is_dir() else None  # a namespace package (data only)


def module_name(path: Path) -> str:
    for top, folder in package_dirs().items():
        base = ROOT / folder
        if path.is_relative_to(base):
            parts = [top, *path.relative_to(base).with_suffix("").parts]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise ValueError(path)


# -- imports, by ast ----------------------------------------------------------------------
def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside ``try: ... except ImportError`` or ``if TYPE_CHECKING:``: not a need."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.Try) and child in parent.body:
            for handler in parent.handlers:
                caught = handler.type
                names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
                if any(getattr(n, "id", None) in IMPORT_ERRORS for n in names):
                    return True
        if isinstance(parent, ast.If) and "TYPE_CHECKING" in ast.unparse(parent.test):
            return True
        child, parent = parent, parents.get(parent)
    return False


def imports_of(path: Path) -> Iterator[tuple[str, list[str], bool]]:
    """(absolute module, names taken from it, guarded) for every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], _guarded(node, parents)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module, [alias.name for alias in node.names], _guarded(node, parents)


def _beside(path: Path, top: str) -> bool:
    """A bare import of a module in the same folder (the sandbox guest runs as a script)."""
    return (path.parent / f"{top}.py").is_file()


@cache
def command_modules() -> dict[str, Path]:
    """Every first-party module the ``speceyes`` command can import, from its entry point
    (through the command tables, whose modules are imported by name, and imports inside
    functions too)."""
    entry = pyproject()["project"]["scripts"]["speceyes"].split(":")[0]
    seen: dict[str, Path] = {}
    todo = [entry]
    while todo:
        name = todo.pop()
        path = module_file(name)
        if name in seen or path is None:
            continue
        seen[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parents run first
        if path.suffix != ".py":
            continue
        for module, names, _ in imports_of(path):
            if module.split(".")[0] in package_dirs():
                todo.append(module)
                todo += [f"{module}.{n}" for n in names if n != "*"]
        todo += command_table(path)
    return seen


def command_table(path: Path) -> list[str]:
    """The modules a ``COMMANDS`` table names (``cli.main``, ``cli.bench``): each is
    imported by name when its command runs."""
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "COMMANDS":
            assert isinstance(node.value, ast.Dict), path  # type: ignore[union-attr]
            return [ast.literal_eval(entry)[0] for entry in node.value.values]  # type: ignore[union-attr]
    return []


def third_party_imports(paths: Iterable[Path]) -> dict[str, set[str]]:
    """Top-level third-party module -> the files that need it (unguarded imports)."""
    needs: dict[str, set[str]] = {}
    for path in paths:
        for module, _, guarded in imports_of(path):
            top = module.split(".")[0]
            ours = top in package_dirs() or _beside(path, top)
            if guarded or ours or top in sys.stdlib_module_names or top == "__future__":
                continue
            needs.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return needs


def shipped_sources() -> list[Path]:
    return sorted(p for folder in package_dirs().values() for p in (ROOT / folder).rglob("*.py"))


# -- what pip installs ----------------------------------------------------------------------
def closure(requirements: Iterable[str]) -> set[str]:
    """The distributions installing ``requirements`` brings, by the installed metadata."""
    found: set[str] = set()
    todo = [(Requirement(r), {""}) for r in requirements]
    while todo:
        requirement, extras = todo.pop()
        if requirement.marker and not any(
            requirement.marker.evaluate({"extra": extra}) for extra in extras
        ):
            continue
        name = canonicalize_name(requirement.name)
        wanted = {""} | set(requirement.extras)
        key = f"{name}[{','.join(sorted(wanted))}]"
        if key in found:
            continue
        found |= {key, name}
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # reported by the caller: not installed here
        todo += [(Requirement(r), wanted) for r in requires]
    return {name for name in found if "[" not in name}


def distributions_of(module: str) -> set[str]:
    return {canonicalize_name(d) for d in metadata.packages_distributions().get(module, [])}


# -- the Dockerfile -------------------------------------------------------------------------
@cache
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    steps: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip().removesuffix("\\") + " "
        if line.rstrip().endswith("\\"):
            continue
        if pending.strip():
            instruction, _, arguments = pending.strip().partition(" ")
            steps.append((instruction.upper(), arguments.strip()))
        pending = ""
    return steps


def copies(steps: list[tuple[str, str]]) -> Iterator[tuple[list[str], str]]:
    """(sources, destination) of each COPY or ADD from the build context."""
    for instruction, arguments in steps:
        if instruction not in ("COPY", "ADD"):
            continue
        words = shlex.split(arguments)
        if any(w.startswith("--from") for w in words):
            continue
        paths = [w for w in words if not w.startswith("--")]
        yield [os.path.normpath(p) for p in paths[:-1]], paths[-1]


PROJECT_INSTALL = re.compile(r"\bpip install\b.*?\s\.(\[(?P<extras>[^\]]*)\])?(\s|$)")


def install_step() -> tuple[int, list[str]]:
    """The RUN that installs the project: (its index among the steps, its extras)."""
    for index, (instruction, arguments) in enumerate(dockerfile()):
        match = PROJECT_INSTALL.search(arguments) if instruction == "RUN" else None
        if match:
            extras = match.group("extras") or ""
            return index, [e.strip() for e in extras.split(",") if e.strip()]
    raise AssertionError("the Dockerfile has no `pip install .` step")


def copied_before_install() -> list[str]:
    index, _ = install_step()
    return [source for sources, _ in copies(dockerfile()[:index]) for source in sources]


def dockerignored(relative: str) -> bool:
    patterns = [
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "!"))
    ]
    parts = Path(relative).parts
    for end in range(1, len(parts) + 1):
        for start in range(end):
            tail = "/".join(parts[start:end])
            for pattern in patterns:
                if start == 0 and fnmatch.fnmatch(tail, pattern):
                    return True
                if pattern.startswith("**/") and fnmatch.fnmatch(tail, pattern[3:]):
                    return True
    return False


def covered(relative: Path, sources: list[str]) -> bool:
    """``relative`` (a path in the repository) is inside one of the COPY sources."""
    return not dockerignored(str(relative)) and any(
        source == "." or relative == Path(source) or relative.is_relative_to(source)
        for source in sources
    )


def image_requirements() -> list[str]:
    """What `pip install .[extras]` in the image asks for."""
    _, extras = install_step()
    optional = pyproject()["project"].get("optional-dependencies", {})
    return [*pyproject()["project"]["dependencies"], *(r for e in extras for r in optional[e])]


# -- the image holds the command ------------------------------------------------------------
def test_the_command_reaches_the_packages_we_expect():
    """The walk itself: from cli.main through the lazy imports to every package."""
    reached = {name.split(".")[0] for name in command_modules()}
    assert reached >= RUNTIME_PACKAGES, sorted(reached)
    assert "lab.synth.report" in command_modules()  # `speceyes bench synth`
    assert set(package_dirs()) >= reached, "the distribution leaves out a package it runs"


def test_the_image_copies_every_package_before_installing():
    """`pip install .` silently installs only the packages it finds: each one the
    distribution ships (all that the command imports, and the migrations it runs) must be
    in the image before that step, and not excluded by .dockerignore."""
    sources = copied_before_install()
    missing = {
        top: str(folder) for top, folder in package_dirs().items() if not covered(folder, sources)
    }
    assert not missing, f"the Dockerfile does not COPY {missing} before `pip install .`"
    for needed in ["pyproject.toml", pyproject()["project"]["readme"], "constraints.txt"]:
        assert covered(Path(needed), sources), f"{needed} is not in the image before install"


def test_the_image_build_context_installs_the_whole_command(tmp_path):
    """Lay out what the Dockerfile copies (less .dockerignore), build the wheel from it
    as the image's `pip install .` does, and find every package the command runs in it,
    with the shipped models, the migrations and the review pages' templates and assets."""
    app = tmp_path / "app"
    app.mkdir()

    def ignore(folder: str, names: list[str]) -> set[str]:
        base = Path(folder).relative_to(ROOT)
        return {n for n in names if dockerignored(str(base / n))}

    index, _ = install_step()
    for sources, destination in copies(dockerfile()[:index]):
        for source in sources:
            target = app / destination
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=ignore, dirs_exist_ok=True)
            elif destination.endswith("/") or len(sources) > 1:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / source, target / Path(source).name)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / source, target)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, str(app), "-w", str(tmp_path / "wheels")], check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "wheels").glob("speceyes-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {
        str(path.relative_to(ROOT / package_dirs()[name.split(".")[0]].parent))
        for name, path in command_modules().items()
        if path.suffix == ".py"
    }
    assert modules - names == set(), "the image's install lacks modules the command runs"
    for shipped in [
        "common/models/weights/synth/small/model.safetensors",
        "migrations/versions/0001_initial.py",
        "migrations/script.py.mako",
        "speceyes_client/py.typed",
    ]:
        assert shipped in names
    # the review pages work offline: every template and asset is in the package
    ui = ROOT / "api" / "ui"
    assets = [p for folder in ("templates", "static") for p in (ui / folder).iterdir()]
    assert assets and {str(p.relative_to(ROOT)) for p in assets} - names == set()


# -- the image installs what the code imports -----------------------------------------------
def test_every_third_party_import_is_installed_by_the_image():
    """Each module the distribution ships imports only the standard library, our own
    packages, and distributions that `pip install .` (with the extras the image names)
    brings, directly or through another: never one that only a dev extra brings."""
    installed = closure(image_requirements())
    problems = []
    for module, files in sorted(third_party_imports(shipped_sources()).items()):
        distributions = distributions_of(module)
        if not distributions:
            problems.append(f"{module} (in {sorted(files)}) is not installed here at all")
        elif not distributions & installed:
            problems.append(f"{module} ({sorted(distributions)}, in {sorted(files)})")
    assert not problems, "imports the image's install does not bring:\n" + "\n".join(problems)


def test_the_labs_runtime_needs_are_not_only_in_a_dev_extra():
    """`speceyes bench synth` plots with matplotlib: lab's imports, the lazy and the
    guarded ones too, come with the image and with a plain `pip install .`."""
    lab = [p for p in shipped_sources() if p.is_relative_to(ROOT / "lab")]
    needs: set[str] = set()
    for path in lab:
        for module, _, _ in imports_of(path):
            top = module.split(".")[0]
            if top not in package_dirs() and top not in sys.stdlib_module_names:
                needs |= distributions_of(top)
    assert "matplotlib" in needs
    plain = closure(pyproject()["project"]["dependencies"])
    assert needs <= plain, f"only in an extra: {sorted(needs - plain)}"
    assert needs <= closure(image_requirements())


# -- the lock ---------------------------------------------------------------------------
def lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_the_lock_pins_every_package_this_venv_holds():
    """constraints.txt is this venv (`make lock` regenerates it); torch is pinned
    without its local label, so the CPU and CUDA builds both satisfy it."""
    pins = lock()
    assert pins["torch"] == "2.13.0"
    drift = []
    paths = sysconfig.get_paths()
    # the installed ones only (setuptools puts its vendored packages on sys.path)
    for distribution in metadata.distributions(path=sorted({paths["purelib"], paths["platlib"]})):
        name = canonicalize_name(distribution.metadata["Name"])
        if name in UNLOCKED:
            continue
        version = Version(distribution.version).public
        if pins.get(name) != version:
            drift.append(f"{name} {version} (lock: {pins.get(name)})")
    assert not drift, "the venv and constraints.txt differ (run make lock): " + ", ".join(drift)


def test_setup_and_the_image_install_under_the_lock():
    """torch from the index the build names, at the lock's version; the rest under the
    lock; `make setup` likewise."""
    runs = [arguments for instruction, arguments in dockerfile() if instruction == "RUN"]
    (torch,) = [r for r in runs if re.search(r"pip install .*\btorch\b", r)]
    assert '--index-url "$TORCH_INDEX"' in torch and '"torch==$TORCH_VERSION"' in torch
    args = dict(a.partition("=")[::2] for i, a in dockerfile() if i == "ARG")
    assert args["TORCH_VERSION"] == lock()["torch"]
    assert "-c constraints.txt" in dockerfile()[install_step()[0]][1]
    makefile = (ROOT / "Makefile").read_text()
    stamp = re.search(r"^\$\(STAMP\):(.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert stamp, "the Makefile has no $(STAMP) recipe"
    assert "constraints.txt" in stamp.group(1).split()
    assert re.search(r"pip install .*-c constraints\.txt .*-e '\.\[dev\]'", stamp.group(2))
    assert re.findall(r"\btorch==(\S+)", stamp.group(2)) == [lock()["torch"]]
    assert re.search(r"^lock:", makefile, re.M)


# -- the sandbox and the ports --------------------------------------------------------------
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _default(value: str) -> str:
    """A Compose value with each ${VAR:-default} replaced by its default."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def test_the_image_has_the_sandbox_and_runs_unprivileged():
    runs = " ".join(a for i, a in dockerfile() if i == "RUN")
    assert re.search(r"apt-get install [^&]*\bbubblewrap\b", runs)
    users = [a for i, a in dockerfile() if i == "USER"]
    assert users and users[-1] == "speceyes"
    head = (ROOT / "Dockerfile").read_text().split("FROM")[0]
    assert "later the API" not in head and "root" in head  # the Thyme worker's needs, told


def test_only_a_thyme_worker_runs_as_root_with_privileges():
    services = compose()["services"]
    privileged = {name for name, s in services.items() if s.get("privileged") or s.get("user")}
    assert privileged == {"worker-thyme"}
    thyme = services["worker-thyme"]
    assert thyme["user"] == "root" and thyme["privileged"] is True
    assert thyme["environment"]["SPECEYES_AGENT"] == "thyme"
    assert thyme["command"][:2] == ["worker", "slow"]


def test_compose_publishes_no_host_port_of_a_local_postgres_or_redis():
    """PostgreSQL's and Redis' ports stay free for the machine's own; what is published
    besides the API is bound to the loopback by default."""
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            *address, host, _ = _default(str(port)).split(":")
            assert host not in ("5432", "6379"), f"{name} takes the host's {host}"
            if name != "api":
                assert address == ["127.0.0.1"], f"{name} publishes {port} beyond the loopback"


# -- the client alone -----------------------------------------------------------------------
CLIENT_PROBE = """
import importlib.util
import httpx
import speceyes_client as c

for absent in ("torch", "celery", "sqlalchemy", "api", "common"):
    assert importlib.util.find_spec(absent) is None, absent

def answer(request):
    if request.url.path == "/v1/jobs/j1":
        assert request.headers["authorization"] == "Bearer k"
        return httpx.Response(200, json={"id": "j1", "status": "done", "answer": "A"})
    return httpx.Response(404, json={"error": "not_found", "detail": "no such job"})

http = httpx.Client(transport=httpx.MockTransport(answer), base_url="http://speceyes")
with c.SpecEyesClient(http=http, api_key="k") as client:
    assert client.wait("j1", timeout=1)["answer"] == "A"
    try:
        client.get("j2")
    except c.NotFound as error:
        assert (error.status, error.error) == (404, "not_found")
    else:
        raise AssertionError("no NotFound")
print("ok")
"""


def test_the_client_installs_and_runs_without_torch_or_celery(tmp_path):
    """speceyes-client (client/) built as a wheel, installed into a fresh venv that holds
    only httpx and what httpx needs (copied from this venv: no network), `pip check`ed,
    and used there."""
    source = tmp_path / "client"
    shutil.copytree(
        ROOT / "client", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", str(source), "-w", "wheels"],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "wheels").glob("speceyes_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (meta,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [
            Requirement(line.split(":", 1)[1].strip())
            for line in archive.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    assert [canonicalize_name(r.name) for r in requires] == ["httpx"]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    for name in closure(str(r) for r in requires):
        distribution = metadata.distribution(name)
        for file in distribution.files or []:
            if ".." in file.parts:
                continue  # scripts outside site-packages
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(distribution.locate_file(file), target)
    into = [*pip, "--python", str(python)]
    subprocess.run([*into, "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    check = subprocess.run([*into, "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    run = subprocess.run(
        [python, "-I", "-c", CLIENT_PROBE], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert run.stdout.strip() == "ok", run.stderr


def test_api_client_re_exports_the_client():
    import speceyes_client

    import api.client

    public = {n for n in vars(speceyes_client) if n[0].isupper() and not n.startswith("_")}
    public -= {"Any", "Path", "Iterable", "Iterator"}
    assert public <= set(api.client.__all__)
    for name in api.client.__all__:
        assert getattr(api.client, name) is getattr(speceyes_client, name)


def test_compose_has_cpu_workers_with_the_synth_models_and_no_gpu():
    """What `docker compose --profile cpu up` adds (docs/operations.md): a fast and a slow
    worker that reserve no GPU and need no hub, beside the GPU ones it scales to 0."""
    services = compose()["services"]
    cpu = {name: s for name, s in services.items() if "cpu" in s.get("profiles", [])}
    assert sorted(cpu) == ["worker-fast-cpu", "worker-slow-cpu"]
    for name, service in cpu.items():
        assert "deploy" not in service, name  # no GPU reservation
        environment = service["environment"]
        assert environment["SPECEYES_LARGE_MODEL"] == environment["SPECEYES_SMALL_MODEL"] == "synth"
        assert (
            environment["SPECEYES_BROKER_URL"]
            == services["worker-fast"]["environment"]["SPECEYES_BROKER_URL"]
        )
    assert [s["command"][1] for s in cpu.values()] == ["fast", "slow"]
    assert (
        "--profile cpu up -d --scale worker-fast=0 --scale worker-slow=0"
        in (ROOT / "docker-compose.yml").read_text()
    )
