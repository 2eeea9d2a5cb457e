"""scikit-learn's digits are checked before training: a copy cut short or edited is refused
(found by review: 1,000 of the 1,797 rows re-zipped trained, exit 0, at another q and δ; a
truncated gzip printed only "Aborted!")."""

from __future__ import annotations

import pytest


def test_the_shipped_digits_pass():
    from gradspec.tasks.cnn import _digits

    images, labels = _digits()
    assert images.shape[0] == labels.shape[0] == 1797


def test_cut_or_edited_digits_are_refused(monkeypatch):
    import sklearn.datasets

    from gradspec.tasks import cnn

    real = sklearn.datasets.load_digits

    def damaged(kind):
        def load(*a, **kw):
            d = real(*a, **kw)
            if kind == "cut":
                d.data, d.target, d.images = d.data[:1000], d.target[:1000], d.images[:1000]
            else:
                d.target = d.target.copy()
                d.target[7] = (d.target[7] + 1) % 10
            return d
        return load

    for kind in ("cut", "label"):
        monkeypatch.setattr(sklearn.datasets, "load_digits", damaged(kind))
        with pytest.raises(ValueError, match="digits.csv.gz .* is not the data set it should be"):
            cnn._digits()

    def unreadable(*a, **kw):
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")

    monkeypatch.setattr(sklearn.datasets, "load_digits", unreadable)
    with pytest.raises(ValueError, match=r"cannot be read \(EOFError\)"):
        cnn._digits()
