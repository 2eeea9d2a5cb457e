"""The flat public surface: every name in gradspec.__all__ imports; the CLI starts fast."""

from __future__ import annotations

import subprocess
import sys

import gradspec


def test_every_public_name_imports():
    for name in gradspec.__all__:
        assert getattr(gradspec, name) is not None, name
    assert len(gradspec.__all__) == len(set(gradspec.__all__))


def test_every_subpackage_all_imports():
    import importlib

    for pkg in ("gradspec.optim", "gradspec.store", "gradspec.collect", "gradspec.train", "gradspec.train._masks"):
        mod = importlib.import_module(pkg)
        for name in mod.__all__:
            assert getattr(mod, name) is not None, f"{pkg}.{name}"
        assert len(mod.__all__) == len(set(mod.__all__)), pkg


def test_new_exports_resolve():
    import gradspec.optim as optim
    import gradspec.train._per_example as per_example
    from gradspec.store import StoreDamagedError
    from gradspec.train import _masks

    assert gradspec.StoreDamagedError is StoreDamagedError and issubclass(StoreDamagedError, OSError)
    assert gradspec.attention_mask_4d is _masks.attention_mask_4d
    assert gradspec.attention_is_causal is _masks.attention_is_causal
    # the masks moved out of _per_example; the old import path still works
    for name in ("attention_mask_4d", "attention_is_causal", "additive_attention_mask"):
        assert getattr(per_example, name) is getattr(_masks, name)
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
