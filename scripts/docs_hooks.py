"""MkDocs hooks of gradspec's documentation site (``hooks:`` in mkdocs.yml).

The pages are the Markdown files of ``docs/``, read in place. At build time these hooks add:

- ``reference/api.md``: every name of ``gradspec.__all__``, grouped as ``gradspec/__init__.py``
  groups them, one mkdocstrings block each. A public name, or a public method or property of a
  public class, without a docstring stops the build (:func:`undocumented`).
- ``reference/cli.md``: ``gradspec --help`` and ``gradspec COMMAND --help`` of every command, as
  the console script prints them at 100 columns (:func:`cli_reference`).
- ``papers/**``: ``analyses/README.md`` and each ``analyses/<paper>/README.md``, as pages.
- ``source/**``: a page showing each repository file outside ``docs/`` that a page links to
  (``examples/plain_loop.py``, a test), so that such a link works in the site as in the repository.
- a line ``--8<-- "README.md:NAME"`` in a page becomes the README's text between
  ``<!-- --8<-- [start:NAME] -->`` and ``<!-- --8<-- [end:NAME] -->``: the tour's real output
  lives once, in the README, and the site's tour shows it (:func:`expand_includes`).

Relative links are written as they work in the repository (on a forge, in an editor); each is
rewritten to where its target is in the site (:func:`rewrite_links`). A link to a file that is
not in the repository stops the build; mkdocs itself (``strict: true`` and ``validation`` in
mkdocs.yml) fails on a broken link or anchor inside the site.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
#: Repository folders whose README.md files are pages of the site, and the site folder they go to.
MOUNTS = {"analyses": "papers"}
#: The columns the command-line reference is rendered at.
HELP_WIDTH = 100
#: Repository files outside docs/ a page may link to, by suffix, and the language to show them in.
SOURCE_LANGUAGES = {".py": "python", ".sh": "bash", ".toml": "toml", ".json": "json",
                    ".yml": "yaml", ".yaml": "yaml", ".txt": "text", ".md": "markdown",
                    ".csv": "text", ".jsonl": "text", ".log": "text"}

_INCLUDE = re.compile(r'^--8<-- "(?P<file>[^":]+):(?P<section>[\w-]+)"\s*$')
_FENCE = re.compile(r"^\s*(?P<fence>`{3,}|~{3,})")
_LINK = re.compile(r"(?P<head>\]\()(?P<target>[^()\s]+)(?P<tail>(?:\s+\"[^\"]*\")?\))")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")

# Markdown of the pages read from docs/, with includes expanded and links rewritten (on_files
# computes it, on_page_markdown hands it to mkdocs).
_rewritten: dict[str, str] = {}


# --- links -------------------------------------------------------------------------------------


def site_path(repo_path: str) -> str | None:
    """Where a repository file is in the site (a path under docs_dir), or None if it is not."""
    if repo_path.startswith("docs/"):
        return repo_path.removeprefix("docs/")
    for folder, mount in MOUNTS.items():
        if repo_path.startswith(f"{folder}/") and repo_path.endswith("README.md"):
            return mount + repo_path.removeprefix(folder)
    if repo_path == "README.md":
        return "index.md"
    return None


def _site_target(target: str, source: str, page: str, sources: set[str]) -> str:
    if _SCHEME.match(target) or target.startswith(("#", "/")):
        return target  # a URL, an anchor on the page itself, or an absolute path (mkdocs judges)
    path, hash_, anchor = target.partition("#")
    repo = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    if repo == ".." or repo.startswith("../"):
        raise PluginError(f"{source}: the link {target!r} leads out of the repository")
    full = ROOT / repo
    if not full.exists():
        raise PluginError(f"{source}: the link {target!r} names {repo}, which is not in the repository")
    if full.is_dir():
        readme = next((n for n in ("README.md", "index.md") if (full / n).is_file()), None)
        if readme is None:
            raise PluginError(f"{source}: the link {target!r} names the folder {repo}, which has no "
                              "README.md or index.md for the site to show")
        repo = posixpath.join(repo, readme)
    dest = site_path(repo)
    if dest is None:
        if full.suffix not in SOURCE_LANGUAGES:
            raise PluginError(f"{source}: the link {target!r} names {repo}, outside docs/, and the site "
                              f"shows only text files from there ({', '.join(sorted(SOURCE_LANGUAGES))})")
        sources.add(repo)
        dest = f"source/{repo}.md"
    return posixpath.relpath(dest, posixpath.dirname(page) or ".") + hash_ + anchor


def rewrite_links(markdown: str, source: str, page: str, sources: set[str]) -> str:
    """Rewrite the relative links of ``markdown`` from repository file ``source`` for site page ``page``.

    Args:
        markdown: text read from ``source`` (a path relative to the repository root).
        source: where the text's links are relative to.
        page: the site page (a path relative to docs_dir) that shows the text.
        sources: collects the repository files outside the site that the links name; each
            gets a page ``source/<path>.md``.

    Returns:
        The text, each ``](target)`` outside code blocks pointing where ``target`` is in the site.

    Raises:
        PluginError: a link names a file or folder that is not in the repository.
    """
    return "".join(
        line if in_code else _LINK.sub(
            lambda m: m["head"] + _site_target(m["target"], source, page, sources) + m["tail"], line)
        for line, in_code in _lines(markdown))


def _lines(markdown: str):
    """Each line of ``markdown`` and whether it is part of a fenced code block."""
    fence = None
    for line in markdown.splitlines(keepends=True):
        m = _FENCE.match(line)
        if fence is not None:
            yield line, True
            if m and m["fence"][0] == fence[0] and len(m["fence"]) >= len(fence):
                fence = None
        elif m:
            fence = m["fence"]
            yield line, True
        else:
            yield line, False


def readme_section(repo_file: str, name: str) -> str:
    """The text of ``repo_file`` between its ``--8<-- [start:name]`` and ``[end:name]`` markers."""
    text = (ROOT / repo_file).read_text(encoding="utf-8")
    start = f"<!-- --8<-- [start:{name}] -->"
    end = f"<!-- --8<-- [end:{name}] -->"
    lines = text.splitlines()
    try:
        first, last = lines.index(start), lines.index(end)
    except ValueError:
        raise PluginError(f"{repo_file} has no section {name!r} (the lines {start!r} and {end!r})") from None
    if last < first:
        raise PluginError(f"{repo_file}: the section {name!r} ends before it starts")
    return "\n".join(lines[first + 1:last]).strip("\n") + "\n"


def expand_includes(markdown: str, source: str, page: str, sources: set[str]) -> str:
    """``markdown`` with each ``--8<-- "FILE:NAME"`` line replaced by that section.

    Each part's links are rewritten relative to the file it comes from (:func:`rewrite_links`);
    a line in a code block is left as it is.
    """
    parts, sections = [], []
    for line, in_code in _lines(markdown):
        m = None if in_code else _INCLUDE.match(line)
        if m is None:
            parts.append(line)
        else:
            section = readme_section(m["file"], m["section"])
            sections.append(rewrite_links(section, m["file"], page, sources))
            parts.append(f"\0{len(sections) - 1}\0\n")
    text = rewrite_links("".join(parts), source, page, sources)
    return re.sub(r"\0(\d+)\0\n", lambda m: sections[int(m[1])], text)


def source_page(repo_path: str) -> str:
    """A page that shows a repository file outside docs/."""
    text = (ROOT / repo_path).read_text(encoding="utf-8")
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=2)
    fence = "`" * max(3, longest + 1)
    language = SOURCE_LANGUAGES[Path(repo_path).suffix]
    return (f"# `{repo_path}`\n\nThe repository's file `{repo_path}`, as of this build of the site.\n\n"
            f"{fence}{language}\n{text.rstrip()}\n{fence}\n")


# --- the API reference -------------------------------------------------------------------------


def _own_doc(value: Any) -> str:
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    if isinstance(value, property):
        value = value.fget
    if isinstance(value, functools.cached_property):
        value = value.func
    return (getattr(value, "__doc__", None) or "").strip()


def _is_member(value: Any) -> bool:
    return inspect.isfunction(value) or isinstance(
        value, staticmethod | classmethod | property | functools.cached_property)


def _gradspec_classes(cls: type) -> list[type]:
    return [k for k in cls.__mro__ if k.__module__.split(".")[0] == "gradspec"]


def undocumented(namespace: Any, names: list[str]) -> list[str]:
    """The public names of ``namespace`` without a docstring, and their public members without one.

    A name counts when it is a class or a function. Its members are the public (no leading
    underscore) methods and properties that its class and its gradspec base classes define. A
    member is documented by its own docstring or, where it overrides one, by the docstring of the
    method it overrides (as ``help()`` and the site show it). A dataclass's generated signature
    line is not a docstring.

    Args:
        namespace: the module (``gradspec``) to look the names up in.
        names: the names to check (``gradspec.__all__``).

    Returns:
        ``NAME`` or ``NAME.member`` for each one missing, in order; a member that a base class
        defines as ``module.Base.member`` (once, however many public classes inherit it).
    """
    missing: list[str] = []
    public = {}  # each public class by its first public name (TrainConfig is CollectConfig too)
    for name in names:
        public.setdefault(getattr(namespace, name), name)
    for name in names:
        obj = getattr(namespace, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)) or public[obj] != name:
            continue
        doc = (obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__) or ""
        if not doc.strip() or doc.startswith(f"{obj.__name__}("):  # a dataclass's generated doc
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        seen: set[str] = set()
        for klass in _gradspec_classes(obj):
            for attr, value in vars(klass).items():
                if attr.startswith("_") or attr in seen or not _is_member(value):
                    continue
                seen.add(attr)
                if not any(_own_doc(vars(k)[attr]) for k in obj.__mro__ if attr in vars(k)):
                    where = public.get(klass) or f"{klass.__module__}.{klass.__qualname__}"
                    if f"{where}.{attr}" not in missing:  # a base's member, once for all its classes
                        missing.append(f"{where}.{attr}")
    return missing


def _first_paragraph(doc: str | None) -> str:
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


def api_reference() -> str:
    """The Markdown of the API reference: ``gradspec.__all__`` by group, one mkdocstrings block a name."""
    import gradspec

    names = [n for n in gradspec.__all__ if n != "__version__"]
    missing = undocumented(gradspec, names)
    if missing:
        raise PluginError("the API reference needs a docstring on each public name and member; "
                          f"{len(missing)} have none: {', '.join(missing)}")
    lines = ["# Python API", "",
             "Every public name of gradspec: `import gradspec`, then `gradspec.NAME` "
             "(the names of `gradspec.__all__`). Grouped by the package that defines them; generated "
             "from the docstrings when the site is built.", ""]
    for module, group in gradspec._EXPORTS.items():
        lines += [f"## `{module}`", "", _first_paragraph(importlib.import_module(module).__doc__), ""]
        for name in group:
            obj = getattr(gradspec, name)
            lines += [f"::: {obj.__module__}.{obj.__qualname__}",
                      "    options:",
                      f'      heading: "gradspec.{name}"',
                      f'      toc_label: "{name}"']
            if inspect.isclass(obj) and len(_gradspec_classes(obj)) > 1:
                # members of gradspec base classes (StepHooks' hooks, a private base's properties)
                lines.append("      inherited_members: true")
            lines.append("")
    return "\n".join(lines)


# --- the command-line reference ----------------------------------------------------------------


def command_help(*args: str) -> str:
    """``gradspec ARGS --help`` as the console script prints it, at :data:`HELP_WIDTH` columns."""
    import click
    import typer

    from cli.main import app

    command = typer.main.get_command(app)
    ctx = click.Context(command, info_name="gradspec", terminal_width=HELP_WIDTH,
                        max_content_width=HELP_WIDTH)
    for name in args:
        command = command.get_command(ctx, name)
        ctx = click.Context(command, info_name=name, parent=ctx, terminal_width=HELP_WIDTH,
                            max_content_width=HELP_WIDTH)
    return command.get_help(ctx)


def command_names() -> list[str]:
    """The commands of ``gradspec``, in the order ``gradspec --help`` lists them (hidden ones left out)."""
    import click
    import typer

    from cli.main import app

    group = typer.main.get_command(app)
    ctx = click.Context(group, info_name="gradspec")
    return [n for n in group.list_commands(ctx) if not group.get_command(ctx, n).hidden]


def cli_reference() -> str:
    """The Markdown of the command-line reference: every command's ``--help``."""
    lines = ["# Command line", "",
             "`gradspec --help` and `gradspec COMMAND --help` of every command, rendered from the "
             "command-line interface when the site is built.", "",
             "```text", command_help().rstrip(), "```", ""]
    for name in command_names():
        lines += [f"## gradspec {name}", "", "```text", command_help(name).rstrip(), "```", ""]
    return "\n".join(lines)


# --- the hooks ---------------------------------------------------------------------------------


def on_files(files: Files, config: Any) -> Files:
    """Add the generated pages, and rewrite the pages of docs/ (their includes and links)."""
    _rewritten.clear()
    sources: set[str] = set()
    generated = {"reference/api.md": api_reference(), "reference/cli.md": cli_reference()}
    for folder in MOUNTS:
        for readme in sorted((ROOT / folder).rglob("README.md")):
            repo = readme.relative_to(ROOT).as_posix()
            page = site_path(repo)
            generated[page] = expand_includes(readme.read_text(encoding="utf-8"), repo, page, sources)
    for file in files.documentation_pages():
        repo = f"docs/{file.src_uri}"
        text = (ROOT / repo).read_text(encoding="utf-8")
        _rewritten[file.src_uri] = expand_includes(text, repo, file.src_uri, sources)
    for repo in sorted(sources):
        generated[f"source/{repo}.md"] = source_page(repo)
    for page, content in generated.items():
        if files.get_file_from_path(page) is not None:
            raise PluginError(f"docs/{page} exists; the site generates that page itself")
        files.append(File.generated(config, page, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Hand mkdocs the rewritten Markdown of a page of docs/."""
    return _rewritten.get(page.file.src_uri, markdown)
