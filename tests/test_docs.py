"""The documentation site (mkdocs.yml, docs/, scripts/docs_hooks.py): it builds in strict mode,
every public name is documented, the generated references are current, links resolve, and a
browser renders a page."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import types
from html import unescape
from pathlib import Path

import pytest
import yaml
from mkdocs.exceptions import PluginError
from typer.testing import CliRunner

import gradspec
from tests._browser import chromium, load

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)

PUBLIC = [n for n in gradspec.__all__ if n != "__version__"]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHON": sys.executable}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as `bash scripts/docs.sh --build` builds it (strict), into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    if Path(gradspec.__path__[0]).resolve().parent == ROOT:
        command = ["bash", str(ROOT / "scripts" / "docs.sh"), "--build", "--site-dir", str(out)]
    else:  # docs.sh would pip-install this checkout over the installed gradspec: build directly
        command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    res = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def _text(html: str) -> str:
    """A page's text: tags dropped, entities decoded, white space collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", "", html)).split())


def test_the_site_builds_strictly_with_every_page(site):
    for page in ("index.html", "tour.html", "own-loop.html", "scaling.html", "concepts.html",
                 "checks.html", "store-format.html", "bad-inputs.html", "architecture.html",
                 "benchmarks.html", "reproductions.html", "development.html", "papers/index.html",
                 "papers/li2022_restricted_lipschitz/index.html", "reference/api.html",
                 "reference/cli.html", "source/examples/plain_loop.py.html"):
        assert (site / page).is_file(), page
    tour = (site / "tour.html").read_text()
    # the README's real output, shown by the tour through its includes, with its figure
    assert "$ gradspec collect --out runs/default --steps 120" in _text(tour)
    assert 'src="spectrum.png"' in tour
    assert (site / "spectrum.png").is_file()


def test_the_api_reference_shows_every_public_name(site):
    html = (site / "reference" / "api.html").read_text()
    for name in PUBLIC:
        obj = getattr(gradspec, name)
        anchor = re.escape(f"{obj.__module__}.{obj.__qualname__}")
        assert re.search(rf'<h3 id="{anchor}"[^>]*>\s*gradspec\.{name}\s*<', html), name
    # each docstring's first line, rendered (markup aside)
    text = " ".join(re.sub(r"[`*]", "", _text(html)).split())
    for name in PUBLIC:
        first = inspect.getdoc(getattr(gradspec, name)).split("\n\n")[0]
        assert " ".join(re.sub(r"[`*]", "", first).split()) in text, name


def test_every_public_name_and_member_has_a_docstring():
    assert hooks.undocumented(gradspec, PUBLIC) == []


def test_the_docstring_check_finds_each_missing_docstring():
    class Base:
        """Documented."""

        def hook(self):
            """The base's docstring, which an override inherits."""

        def bare(self):
            pass

    class Public(Base):
        """Documented."""

        def hook(self):  # inherits Base.hook's docstring
            pass

        def own(self):
            pass

        @property
        def size(self):
            return 1

        def _private(self):
            pass

    @dataclasses.dataclass
    class Settings:
        x: int = 0

    def function():
        pass

    for obj in (Base, Public, Settings, function):
        obj.__module__, obj.__qualname__ = "gradspec.fake", obj.__name__
    namespace = types.SimpleNamespace(Public=Public, Settings=Settings, function=function, Alias=Public,
                                      VERSION="1.0")
    assert hooks.undocumented(namespace, ["Public", "Settings", "function", "Alias", "VERSION"]) == [
        "Public.own", "Public.size", "gradspec.fake.Base.bare", "Settings", "function"]


def test_the_command_line_reference_is_every_commands_help():
    from cli.main import app

    names = hooks.command_names()
    assert {"collect", "info", "account", "pca", "decay", "plot", "retrain"} <= set(names)
    page = hooks.cli_reference()
    runner = CliRunner()
    for name in names:
        res = runner.invoke(app, [name, "--help"], prog_name="gradspec", terminal_width=hooks.HELP_WIDTH,
                            max_content_width=hooks.HELP_WIDTH)
        assert res.exit_code == 0, res.output
        assert res.output.rstrip() == hooks.command_help(name).rstrip()
        assert f"## gradspec {name}\n\n```text\n{res.output.rstrip()}\n```" in page


def _rewrite(text: str, source: str, page: str) -> tuple[str, set[str]]:
    sources: set[str] = set()
    return hooks.rewrite_links(text, source, page, sources), sources


def test_links_are_rewritten_to_where_their_targets_are_in_the_site():
    text, sources = _rewrite(
        "[ex](../examples/plain_loop.py) [a](../analyses/li2022_adadps/README.md#x) "
        "[b](bench_pca.txt) [c](https://example.org/a.md) [d](#here) [e](../analyses/)\n"
        "```\n[in code](../no/such.py)\n```\n", "docs/own-loop.md", "own-loop.md")
    assert text == (
        "[ex](source/examples/plain_loop.py.md) [a](papers/li2022_adadps/README.md#x) "
        "[b](bench_pca.txt) [c](https://example.org/a.md) [d](#here) [e](papers/README.md)\n"
        "```\n[in code](../no/such.py)\n```\n")
    assert sources == {"examples/plain_loop.py"}
    # the README's links, shown on a page one folder down
    text, _ = _rewrite("![s](docs/spectrum.png) [t](docs/tour.md)", "README.md", "papers/x.md")
    assert text == "![s](../spectrum.png) [t](../tour.md)"


@pytest.mark.parametrize(("target", "message"), [
    ("../no/such/file.py", "not in the repository"),
    ("../../outside.md", "leads out of the repository"),
    ("../gradspec/", "has no README.md or index.md"),
    ("../gradspec/py.typed", "shows only text files"),
], ids=["missing", "outside", "folder", "not-text"])
def test_a_link_to_nothing_in_the_repository_stops_the_build(target, message):
    with pytest.raises(PluginError, match=message):
        _rewrite(f"[x]({target})", "docs/tour.md", "tour.md")


def test_a_readme_section_is_shown_once_and_a_missing_one_stops_the_build():
    intro = hooks.readme_section("README.md", "intro")
    assert intro.startswith("**Spectral analysis of gradient subspaces")
    assert "<!--" not in intro
    page = hooks.expand_includes('# t\n\n--8<-- "README.md:decay"\n\n```\n--8<-- "README.md:nope"\n```\n',
                                 "docs/tour.md", "tour.md", set())
    assert "![singular values vs rank](spectrum.png)" in page  # the README's docs/spectrum.png
    assert '--8<-- "README.md:nope"' in page  # a line in a code block is left alone
    with pytest.raises(PluginError, match="no section 'nope'"):
        hooks.expand_includes('--8<-- "README.md:nope"\n', "docs/tour.md", "tour.md", set())


def test_the_readmes_output_lives_once():
    """A console block of the README is shown in the site by include, never copied into docs/."""
    readme = (ROOT / "README.md").read_text()
    docs = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    blocks = re.findall(r"```console\n(.*?)```", readme, re.S)
    assert len(blocks) >= 5
    for block in blocks:
        for line in block.splitlines():
            if len(line) > 30:
                assert line not in docs, line


def test_a_broken_link_or_anchor_fails_a_build_with_the_sites_settings(tmp_path):
    """mkdocs' own validation, as mkdocs.yml sets it, fails strict builds on broken links and anchors."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n[there](other.md#no-such-heading) [gone](gone.md)\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A heading\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(
        {"site_name": "t", "strict": config["strict"], "validation": config["validation"],
         "nav": ["index.md", "other.md"]}))
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--site-dir", str(tmp_path / "site")],
                         cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "gone.md" in res.stderr and "no-such-heading" in res.stderr, res.stderr


def test_a_browser_renders_the_home_page(site, tmp_path):
    if chromium() is None:
        pytest.skip("no Chromium installed (apt-get install -y chromium)")
    dom, _ = load(site / "index.html", tmp_path / "profile", extra=("--virtual-time-budget=5000",), timeout=120)
    assert "<title>gradspec</title>" in dom
    text = _text(dom)
    assert "Spectral analysis of gradient subspaces in (differentially private) training." in text
    assert "bash scripts/test.sh" in text  # the README's commands, included
    assert 'href="reference/api.html"' in dom and "Python API" in text  # the navigation
    assert 'href="tour.html"' in dom
    assert "fonts.googleapis" not in dom  # nothing fetched from the network
