"""The flat public surface: every name in gradspec.__all__ imports; the CLI starts fast."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import gradspec


def test_every_public_name_imports():
    for name in gradspec.__all__:
        assert getattr(gradspec, name) is not None, name
    assert len(gradspec.__all__) == len(set(gradspec.__all__))


def test_every_subpackage_all_imports():
    import importlib

    for pkg in ("gradspec.optim", "gradspec.store", "gradspec.collect", "gradspec.train", "gradspec._attention"):
        mod = importlib.import_module(pkg)
        for name in mod.__all__:
            assert getattr(mod, name) is not None, f"{pkg}.{name}"
        assert len(mod.__all__) == len(set(mod.__all__)), pkg


def test_new_exports_resolve():
    import gradspec._attention as attention
    import gradspec.optim as optim
    import gradspec.train as train
    from gradspec.store import StoreDamagedError

    assert gradspec.StoreDamagedError is StoreDamagedError and issubclass(StoreDamagedError, OSError)
    # the masks live below train and tasks (model plumbing); train still exports them
    for name in ("attention_mask_4d", "attention_is_causal", "additive_attention_mask"):
        assert getattr(train, name) is getattr(attention, name)
    assert gradspec.attention_mask_4d is attention.attention_mask_4d
    assert gradspec.attention_is_causal is attention.attention_is_causal
    for name in ("spectrum_layout", "algorithm_options", "frequency_side_information",
                 "load_side_information", "public_ids"):
        assert name in optim.__all__ and callable(getattr(optim, name)), name


def test_unknown_name_raises_attribute_error():
    try:
        gradspec.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_import_and_help_do_not_load_heavy_libraries():
    code = "import sys, gradspec, cli.main; print(sorted(m for m in ('torch', 'zarr', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"



def test_the_privacy_package_loads_its_heavy_parts_on_first_use():
    """`gradspec info` reads a run's sampling rate through gradspec.privacy: that must not wait
    ~2 s for torch, scipy and dp-accounting (it took 3.7 s of which 3.1 were these imports)."""
    code = (
        "import sys\n"
        "from gradspec.privacy import accounted_sample_rate, rate_text\n"
        "heavy = ('torch', 'scipy', 'dp_accounting')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "import gradspec.privacy as p\n"
        "assert p.clip_rows.__module__ == 'gradspec.privacy._clip'\n"
        "assert p.PrivacyAccountant.__module__ == 'gradspec.privacy._accountant'\n"
        "assert set(p.__all__) <= set(dir(p))\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert "torch" in out[1]  # clipping needs it, and loaded it when first used
    with pytest.raises(AttributeError, match="no_such_name"):
        gradspec.privacy.no_such_name  # noqa: B018


def test_every_privacy_name_resolves_to_its_module():
    import importlib

    privacy = importlib.import_module("gradspec.privacy")
    for module, names in privacy._EXPORTS.items():
        for name in names:
            assert getattr(privacy, name) is getattr(importlib.import_module(module), name)


def test_recorder_exports_resolve():
    import importlib

    collect_pkg = importlib.import_module("gradspec.collect")

    assert gradspec.GradientRecorderCallback is collect_pkg.GradientRecorderCallback  # lazy in gradspec.collect
    assert gradspec.GradientRecorder is collect_pkg.GradientRecorder
    assert gradspec.record_opacus is collect_pkg.record_opacus
    try:
        collect_pkg.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


FIRST_IMPORTS = {  # what a program may import before it asks for the flat ``collect``
    "nothing": "",
    "the-subpackage": "import gradspec.collect",
    "from-the-subpackage": "from gradspec.collect import GradientRecorder",
    "a-private-module": "from gradspec.collect import _recorder",
    "the-trainer": "import gradspec.train",
    "the-optimizers": "import gradspec.optim",
    "a-flat-recorder-name": "from gradspec import GradientRecorder",
}


@pytest.mark.parametrize("first", list(FIRST_IMPORTS.values()), ids=list(FIRST_IMPORTS))
def test_flat_collect_is_the_function_whatever_was_imported_first(first):
    """The subpackage ``gradspec.collect`` and the function ``collect`` share a name: the flat
    API's is the function in either import order (fresh interpreters, no cached state)."""
    code = textwrap.dedent(f"""
        import importlib, inspect
        {first}
        from gradspec import collect
        import gradspec
        assert inspect.isfunction(collect), collect
        # and after the subpackage is (re)imported, the other order
        import gradspec.collect
        from gradspec.collect import GradientRecorder, _recorder
        package = importlib.import_module("gradspec.collect")
        assert gradspec.collect is collect is package.collect, (gradspec.collect, collect)
        from gradspec import collect as again
        assert again is collect
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
