"""plugstack.conf's `controller=URL`: the SPANK plugin takes exactly the URLs the driver's
client (`slurmrl.client.rpc.split_url`) takes, so that no job gets a URL its driver refuses.

The plugin's `slurm_spank_init` is compiled with gcc against spank.h into a small program
whose stubs print what Slurm would log; gcc and spank.h are part of the setup (`make
deps` installs gcc and libslurm-dev), so a missing one fails the tests.
tests/integration/test_spank.py loads the real plugin through sbatch.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from spank_harness import compile_harness

from slurmrl.client.rpc import split_url

HARNESS = r"""
#include <stdarg.h>
#include <stdio.h>
#include <slurm/spank.h>

LOG_STUBS
spank_context_t spank_context(void) { return S_CTX_LOCAL; }
spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{ (void)sp; (void)opt; return ESPANK_SUCCESS; }
const char *spank_strerror(spank_err_t e) { (void)e; return "error"; }
spank_err_t spank_setenv(spank_t sp, const char *n, const char *v, int o)
{ (void)sp; (void)n; (void)v; (void)o; return ESPANK_SUCCESS; }
spank_err_t spank_unsetenv(spank_t sp, const char *n) { (void)sp; (void)n; return ESPANK_SUCCESS; }
spank_err_t spank_job_control_setenv(spank_t sp, const char *n, const char *v, int o)
{ (void)sp; (void)n; (void)v; (void)o; return ESPANK_SUCCESS; }
spank_err_t spank_getenv(spank_t sp, const char *n, char *buf, int len)
{ (void)sp; (void)n; (void)buf; (void)len; return ESPANK_ENV_NOEXIST; }

#include "PLUGIN"

int main(int argc, char **argv)
{
	printf("rc=%d\n", slurm_spank_init(NULL, argc - 1, argv + 1));
	return 0;
}
"""

ACCEPTED = [
    "http://127.0.0.1:6829", "http://slurmrl.example.org:6829", "http://ctl", "http://ctl/",
    "http://ctl:6829/", "http://node_01:1", "http://ctl:65535", "http://[::1]:6829",
    "http://[fe80::1]",
]
REFUSED = [
    "https://ctl:6829", "HTTP://ctl", "ftp://ctl", "http://", "http://ctl:", "http://ctl:0",
    "http://ctl:65536", "http://ctl:123456", "http://ctl:6829/v1", "http://ctl:6829?x=1",
    "http://alice@ctl:6829", "http://ctl:68a9", "http://:6829", "http://[::1", "http://[]:1",
    "http://ct\u00e9l:1", "http://" + "a" * 1100,
]


@pytest.fixture(scope="module")
def plugin_init(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_harness(tmp_path_factory, HARNESS, "init")


def _plugin(init: Path, *args: str) -> tuple[bool, str]:
    out = subprocess.run([str(init), *args], capture_output=True, check=True).stdout.decode()
    return out.endswith("rc=0\n"), out


def _client_takes(url: str) -> bool:
    try:
        split_url(url)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("url", ACCEPTED + REFUSED, ids=lambda u: u[:40])
def test_the_plugin_takes_a_controller_url_exactly_when_the_client_does(
    plugin_init: Path, url: str,
) -> None:
    ok, out = _plugin(plugin_init, f"controller={url}", "debug=no")
    assert _client_takes(url) is (url in ACCEPTED)
    assert ok is (url in ACCEPTED), out
    if not ok:
        assert "slurmrl: plugstack.conf: controller=" in out
        assert "expected http://HOST[:PORT]" in out


def test_an_unknown_argument_is_still_refused_by_name(plugin_init: Path) -> None:
    ok, out = _plugin(plugin_init, "controller=http://ctl:6829", "colour=blue")
    assert not ok and "unknown argument 'colour=blue'" in out
