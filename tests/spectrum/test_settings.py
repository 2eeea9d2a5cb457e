"""`gradspec.spectrum.decay_config`: `gradspec decay`'s option parsing, callable from Python."""

from __future__ import annotations

import pytest

from gradspec.spectrum import DecayConfig, decay_config, parse_bandwidth, parse_rank_range


def test_defaults_are_decay_configs():
    assert decay_config() == DecayConfig()


def test_options_as_typed_become_the_config():
    cfg = decay_config(fit_range=" 2:50", ci="bootstrap", bandwidth="0.25", tail="fit", k_max=40,
                       every_rank=True, n=1000, epsilon=2.0, delta=1e-5, diameter=3.0, dim=77)
    assert cfg == DecayConfig(fit_range=(2, 50), ci="bootstrap", bandwidth=0.25, tail="fit", k_max=40,
                              every_rank=True, n=1000, epsilon=2.0, delta=1e-5, diameter=3.0, dim=77)
    assert cfg.has_bound_inputs and type(cfg.tail) is str and type(cfg.ci) is str
    assert decay_config(fit_range=(1, 9)).fit_range == (1, 9)


@pytest.mark.parametrize("text", ["1-3", "1:", ":5", "1:5:2", "a:b", "1:2:3:4", "1.5:3"])
def test_a_fit_range_that_is_not_a_colon_b_is_one_error(text):
    with pytest.raises(ValueError, match=r"^--fit-range .* is not A:B with integers \(e\.g\. 1:1000\)$"):
        decay_config(fit_range=text)


def test_rank_range_edge_values():
    assert parse_rank_range(None) is None and parse_rank_range("") is None
    assert parse_rank_range("3:7", "--x") == (3, 7)
    with pytest.raises(ValueError, match="--x"):
        parse_rank_range("3", "--x")
    with pytest.raises(ValueError, match="not a pair of integers"):
        parse_rank_range((1, 2, 3))


@pytest.mark.parametrize("given", [dict(n=10), dict(n=10, epsilon=1.0, delta=1e-5),
                                   dict(diameter=1.0), dict(epsilon=1.0, delta=1e-5, diameter=2.0)])
def test_the_bound_inputs_come_all_or_none(given):
    with pytest.raises(ValueError, match=r"the bounds need all of --n, --epsilon, --delta and --diameter"):
        decay_config(**given)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("tail", "fitt", r"unknown --tail 'fitt'; choose one of: hold, fit, zero"),
    ("ci", "boot", r"unknown --ci 'boot'; choose one of: analytic, bootstrap"),
])
def test_unknown_choices_name_the_valid_ones(option, value, message):
    with pytest.raises(ValueError, match=message):
        decay_config(**{option: value})


def test_bandwidth_number_or_rule():
    assert parse_bandwidth("silverman") == "silverman" and parse_bandwidth("1e-2") == 0.01
    assert parse_bandwidth(0.5) == 0.5
