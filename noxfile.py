# Copyright: pi-dispatch egress team
# Apache License 2.0 (see LICENSE)
"""The collection's gates that need no Docker Engine, as nox sessions (antsibull-nox).

antsibull-nox.toml adds lint (codeqa: ruff; yamllint), ansible-lint and build-import-check. This
file adds the ansible-core matrix (sanity-<x.y>, units-<x.y>, collection-<x.y> for 2.17, 2.18
and 2.19) and the gates antsibull-nox has no session for (changelog, docs). ./run calls them
(./run gate <name>, ./run test); alone: .venv/bin/nox -R -s sanity-2.19 (docs/testing.md).

This machine reaches no container registry: ansible-test runs in --venv (sanity) or --local
(units) mode, never --docker. Every venv is under the checkout (.nox/), and ansible-test, which
keeps its venvs under ~/.ansible/test, runs with HOME=.cache/ansible-test-home as ./run did.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import sys
from pathlib import Path

import nox

try:
    import antsibull_nox
    import antsibull_nox.sessions
    from antsibull_nox.sessions.utils.packages import PackageConstraints, PackageRequirements
except ImportError:
    print("nox needs antsibull-nox in the same venv: ./run bootstrap installs both (requirements-nox.txt)")
    sys.exit(1)

ROOT = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("PI_EGRESS_CACHE", ROOT / ".cache"))
TEST_HOME = CACHE / "ansible-test-home"
CORE_VERSIONS = os.environ.get("PI_EGRESS_CORE_VERSIONS", "2.17 2.18 2.19").split()
PYTHON = "%d.%d" % sys.version_info[:2]  # the Python of .venv: ansible-test's --python
PINS = PackageConstraints("requirements.txt")

# A second run reuses every venv under .nox/ (./run adds -R when no requirement file changed).
nox.options.reuse_venv = "yes"


def _use_test_home() -> None:
    """HOME for every tool nox starts: ansible-test's venvs and pip bootstrap stay in the checkout.

    pip there still reads the operator's own pip.conf (an index mirror, say), as with ./run.
    """
    home = os.environ.get("HOME", "")
    for conf in (".config/pip/pip.conf", ".pip/pip.conf"):
        source, link = Path(home, conf), TEST_HOME / conf
        if home and source.is_file() and not link.exists() and not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source)
    TEST_HOME.mkdir(parents=True, exist_ok=True)
    os.environ["HOME"] = str(TEST_HOME)
    os.environ["ANSIBLE_HOME"] = str(CACHE / "ansible-home")
    os.environ.setdefault("ANSIBLE_NOCOLOR", "1")
    os.environ["ANSIBLE_COLLECTIONS_SCAN_SYS_PATH"] = "false"


_use_test_home()
antsibull_nox.load_antsibull_nox_toml()


def _install_get_pip_standin() -> None:
    """ansible-test bootstraps pip in each venv with get_pip_<version>.py from a host this network
    cannot reach; tests/sanity/get_pip_standin.py stands in for it (ensurepip, then pip from the
    index), in ansible-test's cache, for the pip version of every ansible-test under .nox/."""
    cache = TEST_HOME / ".ansible" / "test" / "cache"
    pattern = "*/lib/python*/site-packages/ansible_test/_internal/python_requirements.py"
    for requirements in (ROOT / ".nox").glob(pattern):
        match = re.search(r"pip='([0-9.]+)'", requirements.read_text(encoding="utf-8"))
        if not match:
            continue
        cached = cache / ("get_pip_%s.py" % match.group(1).replace(".", "_"))
        if not cached.is_file() or cached.stat().st_size == 0:
            cache.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / "tests" / "sanity" / "get_pip_standin.py", cached)
            print("pip bootstrap for ansible-test: %s (stand-in, see tests/sanity/get_pip_standin.py)" % cached)


def _drop_test_tmp() -> None:
    """ansible-test's tests/output/.tmp in the copy (pylint's leftovers): antsibull-nox copies
    tests/output back into the checkout after the run, and fails on what vanishes meanwhile."""
    shutil.rmtree(Path("tests", "output", ".tmp"), ignore_errors=True)


def _core_packages(core: str, *extra: object) -> list[object]:
    return ["ansible-core==%s.*" % core, *extra]


def add_sanity(core: str) -> None:
    """ansible-test sanity in --venv mode from a copy (no ignore file: every test must pass)."""
    antsibull_nox.add_ansible_test_session(
        name="sanity-%s" % core,
        description="ansible-test sanity --venv, ansible-core %s (the sanity gate)" % core,
        ansible_test_params=["sanity", "--color", "no", "--venv", "--python", PYTHON],
        default=False,
        ansible_core_version=core,
        ansible_core_source="pypi",
        register_name="sanity",
        callback_before=_install_get_pip_standin,
        callback_after=_drop_test_tmp,
    )


def add_units(core: str) -> None:
    """ansible-test units --local (it collects tests/unit/plugins only) from a copy, then pytest
    of all of tests/unit (tests/unit/repo too) with the coverage of plugins/ and its floor."""

    packages = _core_packages(core, PackageRequirements("requirements-core.txt"))

    @antsibull_nox.sessions.install_packages(packages=packages)
    def units(session: nox.Session) -> None:
        prepared = antsibull_nox.sessions.prepare_collections(
            session, ansible_core_version=core, install_in_site_packages=False, install_out_of_tree=True)
        if not prepared:
            session.error("could not copy the collection into an ansible_collections tree")
        with session.chdir(prepared.current_path):
            session.run("ansible-test", "units", "--local", "--python", PYTHON, "--color", "no")
        version = session.run("python", "-c", "import ansible; print(ansible.__version__)", silent=True).strip()
        (CACHE / "coverage").mkdir(parents=True, exist_ok=True)
        session.run("pytest", "-q", "-p", "no:cacheprovider", "tests/unit", "--cov=plugins", "--cov-report=term",
                    "--cov-config=%s" % (ROOT / ".coveragerc"), "--cov-fail-under=74",
                    env={"COVERAGE_FILE": str(CACHE / "coverage" / ("units-%s" % version))})

    units.__doc__ = "ansible-test units --local and pytest tests/unit with coverage, ansible-core %s" % core
    nox.session(name="units-%s" % core)(units)


def add_collection(core: str) -> None:
    """The release path an operator takes: build the tarball, install it into an empty path, and
    read every module's and every role's documentation from that install with ansible-doc."""

    @antsibull_nox.sessions.install_packages(packages=_core_packages(core, PackageConstraints("requirements-core.txt")))
    def collection(session: nox.Session) -> None:
        base = Path(session.create_tmp()) / "collection"
        shutil.rmtree(base, ignore_errors=True)
        (base / "build").mkdir(parents=True)
        session.run("ansible-galaxy", "collection", "build", "--force", "--output-path", str(base / "build"), str(ROOT))
        tarball = next((base / "build").glob("pi_dispatch-egress-*.tar.gz"))
        env = {"ANSIBLE_COLLECTIONS_PATH": str(base / "collections")}
        session.run("ansible-galaxy", "collection", "install", "-p", str(base / "collections"), str(tarball), env=env)
        failed = []
        checks = [(["ansible-doc", "pi_dispatch.egress.%s" % p.stem], r"^> MODULE pi_dispatch\.egress\.%s" % p.stem)
                  for p in sorted((ROOT / "plugins" / "modules").glob("*.py"))]
        checks += [(["ansible-doc", "-t", "role", "pi_dispatch.egress.%s" % p.name], r"ENTRY POINT: \*?main")
                   for p in sorted((ROOT / "roles").iterdir()) if p.is_dir()]
        for command, expected in checks:
            out = session.run(*command, env=env, silent=True, success_codes=range(256)) or ""
            if re.search(expected, out, re.MULTILINE):
                session.log("%s: documented" % " ".join(command))
            else:
                print(out)
                failed.append(" ".join(command))
        if failed:
            session.error("no documentation from: %s" % ", ".join(failed))

    collection.__doc__ = "collection build, install into an empty path, ansible-doc of every module and role, " \
        "ansible-core %s" % core
    nox.session(name="collection-%s" % core)(collection)


for _core in CORE_VERSIONS:
    add_sanity(_core)
    add_units(_core)
    add_collection(_core)


@nox.session(name="changelog")
@antsibull_nox.sessions.install_packages(packages=["antsibull-changelog", PINS])
def changelog(session: nox.Session) -> None:
    """antsibull-changelog lint; CHANGELOG.md must be what changelogs/ generates."""
    session.run("antsibull-changelog", "lint")
    session.run("antsibull-changelog", "lint-changelog-yaml", "changelogs/changelog.yaml")
    target = ROOT / "CHANGELOG.md"
    saved = target.read_text(encoding="utf-8")
    try:
        session.run("antsibull-changelog", "generate")
        generated = target.read_text(encoding="utf-8")
    finally:
        target.write_text(saved, encoding="utf-8")
    if generated != saved:
        sys.stdout.writelines(difflib.unified_diff(saved.splitlines(True), generated.splitlines(True),
                                                   "CHANGELOG.md", "generated"))
        session.error("CHANGELOG.md is not what changelogs/ generates: add a fragment under changelogs/fragments/"
                      " instead of editing CHANGELOG.md (docs/releasing.md)")


@nox.session(name="docs")
@antsibull_nox.sessions.install_packages(
    packages=["ansible-core", "antsibull-docs", "sphinx", "sphinx-ansible-theme", "myst-parser", PINS])
def docs(session: nox.Session) -> None:
    """Docs site: antsibull-docs reference of the collection and the guides, sphinx-build -W."""
    prepared = antsibull_nox.sessions.prepare_collections(
        session, install_in_site_packages=False, install_out_of_tree=True)
    if not prepared:
        session.error("could not copy the collection into an ansible_collections tree")
    base = Path(session.create_tmp()) / "docs"
    shutil.rmtree(base, ignore_errors=True)
    rst = base / "rst"
    rst.mkdir(parents=True)
    rst.chmod(0o755)  # antsibull-docs wants the destination writable by itself only
    env = {"ANSIBLE_COLLECTIONS_PATH": str(prepared.current_place)}
    session.run("antsibull-docs", "--config-file", str(ROOT / "docs/site/antsibull-docs.cfg"), "collection",
                "--use-current", "--fail-on-error", "--dest-dir", str(rst), "pi_dispatch.egress", env=env)
    for name in ("index.rst", "ansible-references.rst"):
        shutil.copy(ROOT / "docs/site" / name, rst)
    (rst / "guides").mkdir()
    for guide in (ROOT / "docs").glob("*.md"):
        shutil.copy(guide, rst / "guides")
    session.run("sphinx-build", "-b", "html", "-W", "--keep-going", "-q", "-c", str(ROOT / "docs/site"),
                str(rst), str(base / "html"), env=env)
    shutil.rmtree(CACHE / "docs-site", ignore_errors=True)
    shutil.move(str(base / "html"), str(CACHE / "docs-site"))
    session.log("docs site: %s" % (CACHE / "docs-site" / "index.html"))


# Allow to run the noxfile with `python noxfile.py` (nox >= 2025.02.09).
if __name__ == "__main__":
    nox.main()
