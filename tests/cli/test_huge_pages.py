"""`gradspec` defaults torch's CPU allocator to huge pages in its own process, never over a
user's choice (docs/bench_opacus_recording.txt: an Opacus step at p = 1.06M ran 2.6x faster)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cli.main import HUGE_PAGES_ENV, prefer_huge_pages


def test_linux_without_a_value_gets_huge_pages():
    env: dict[str, str] = {"PATH": "/bin"}
    assert prefer_huge_pages(env, platform="linux") is True
    assert env == {"PATH": "/bin", HUGE_PAGES_ENV: "1"}


@pytest.mark.parametrize("value", ["0", "1", "", "yes"])
def test_a_value_the_user_set_is_kept(value):
    env = {HUGE_PAGES_ENV: value}
    assert prefer_huge_pages(env, platform="linux") is False
    assert env == {HUGE_PAGES_ENV: value}


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_other_systems_are_left_alone(platform):
    env: dict[str, str] = {}
    assert prefer_huge_pages(env, platform=platform) is False
    assert env == {}


_PROBE = (
    "import os, sys\n"
    "from cli.main import main\n"
    "assert 'torch' not in sys.modules\n"
    "sys.argv = ['gradspec', '--version']\n"
    "try:\n"
    "    main()\n"
    "except SystemExit:\n"
    "    pass\n"
    f"print(os.environ.get({HUGE_PAGES_ENV!r}))\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages are a Linux default")
@pytest.mark.parametrize(("given", "seen"), [(None, "1"), ("0", "0")])
def test_the_console_script_sets_it_before_torch_is_imported(given, seen):
    env = {k: v for k, v in os.environ.items() if k != HUGE_PAGES_ENV}
    if given is not None:
        env[HUGE_PAGES_ENV] = given
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == seen
