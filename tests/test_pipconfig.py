"""pip's configuration, as pip itself reads it: variables, pip.conf, precedence, pip's default index."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hermetic.errors import BadInput
from hermetic.fetch.pipconfig import PipConfig, load_pip_config

PIP_MODULES = ("pip", "pip._internal", "pip._internal.configuration", "pip._internal.exceptions",
               "pip._internal.models", "pip._internal.models.index")


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment whose user config and caches live in tmp_path, so the machine's own cannot leak in."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.update(extra)
    return env


def pip_reported_index(env: dict[str, str]) -> str:
    """The index URL pip itself would use, as `pip install --help` reports it (it shows configured values)."""
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--help"], env=env, capture_output=True,
                         text=True, check=True, cwd=env["HOME"]).stdout
    m = re.search(r"--index-url <url>\s+Base URL.*?\(default\s+(\S+?)\)", out, re.DOTALL)
    assert m, out
    return m.group(1)


def hide_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in PIP_MODULES:
        monkeypatch.setitem(sys.modules, mod, None)  # None in sys.modules makes the import fail


def test_env_vars_are_honoured(tmp_path: Path) -> None:
    env = base_env(tmp_path, PIP_CONFIG_FILE=os.devnull,
                   PIP_INDEX_URL="http://127.0.0.1:9/simple",
                   PIP_EXTRA_INDEX_URL="http://127.0.0.1:10/simple  file:///srv/extra",
                   PIP_FIND_LINKS="/srv/wheels\n/srv/more", PIP_NO_INDEX="yes",
                   PIP_CERT="/etc/ca.pem", PIP_CLIENT_CERT="~/client.pem",
                   PIP_TRUSTED_HOST="127.0.0.1 localhost:8080", PIP_PROXY="http://127.0.0.1:3128",
                   PIP_DEFAULT_TIMEOUT="7.5", PIP_RETRIES="2")
    before = dict(os.environ)
    cfg = load_pip_config(env)
    assert dict(os.environ) == before  # the temporary environment did not leak
    assert cfg == PipConfig(
        index_url="http://127.0.0.1:9/simple",
        extra_index_urls=("http://127.0.0.1:10/simple", "file:///srv/extra"),
        find_links=("/srv/wheels", "/srv/more"), no_index=True, cert="/etc/ca.pem",
        client_cert=str(tmp_path / "home" / "client.pem"),
        trusted_hosts=("127.0.0.1", "localhost:8080"), proxy="http://127.0.0.1:3128",
        timeout=7.5, retries=2)
    assert cfg.index_urls == ()  # pip's --no-index drops the extra indexes too


def write_conf(tmp_path: Path) -> Path:
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\n"
        "index-url = http://127.0.0.1:11/simple\n"
        "extra-index-url =\n    http://127.0.0.1:12/simple\n    http://127.0.0.1:13/simple\n"
        "timeout = 3\n"
        "find-links = /from/global\n"
        "[install]\n"
        "find-links = /from/install\n"
        "trusted-host = 127.0.0.1\n"
        "[download]\n"
        "retries = 9\n")
    return conf


def test_pip_conf_via_pip_config_file(tmp_path: Path) -> None:
    env = base_env(tmp_path, PIP_CONFIG_FILE=str(write_conf(tmp_path)))
    cfg = load_pip_config(env)
    assert cfg.index_url == "http://127.0.0.1:11/simple"
    assert cfg.extra_index_urls == ("http://127.0.0.1:12/simple", "http://127.0.0.1:13/simple")
    assert cfg.timeout == 3.0
    assert cfg.find_links == ("/from/install",)   # [install] beats [global], as for `pip install`
    assert cfg.trusted_hosts == ("127.0.0.1",)
    assert cfg.retries == 5                       # [download] is another command's section
    assert cfg.index_urls == ("http://127.0.0.1:11/simple", "http://127.0.0.1:12/simple",
                              "http://127.0.0.1:13/simple")


def test_env_var_replaces_the_file_option(tmp_path: Path) -> None:
    env = base_env(tmp_path, PIP_CONFIG_FILE=str(write_conf(tmp_path)),
                   PIP_EXTRA_INDEX_URL="http://127.0.0.1:14/simple", PIP_TIMEOUT="", PIP_FIND_LINKS="/env")
    cfg = load_pip_config(env)
    assert cfg.extra_index_urls == ("http://127.0.0.1:14/simple",)  # replaced, not appended
    assert cfg.find_links == ("/env",)
    assert cfg.timeout == 3.0  # an empty value is ignored, as pip does


def test_use_deprecated_legacy_certs(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nuse-deprecated = legacy-resolver\n[install]\nuse-deprecated = legacy-certs\n")
    from_file = load_pip_config(base_env(tmp_path, PIP_CONFIG_FILE=str(conf)))
    assert from_file.use_deprecated == ("legacy-certs",) and from_file.legacy_certs
    both = load_pip_config(base_env(tmp_path, PIP_CONFIG_FILE=os.devnull,
                                    PIP_USE_DEPRECATED="legacy-resolver legacy-certs"))
    assert both.use_deprecated == ("legacy-resolver", "legacy-certs") and both.legacy_certs
    # the variable replaces the file's list, as for every pip option
    replaced = load_pip_config(base_env(tmp_path, PIP_CONFIG_FILE=str(conf), PIP_USE_DEPRECATED="legacy-resolver"))
    assert not replaced.legacy_certs
    assert not load_pip_config(base_env(tmp_path, PIP_CONFIG_FILE=os.devnull)).legacy_certs


def test_user_pip_conf_is_read(tmp_path: Path) -> None:
    env = base_env(tmp_path)
    user_conf = tmp_path / "home" / ".config" / "pip" / "pip.conf"
    user_conf.parent.mkdir(parents=True)
    user_conf.write_text("[global]\nindex-url = http://127.0.0.1:15/simple\n")
    assert load_pip_config(env).index_url == "http://127.0.0.1:15/simple"


@pytest.mark.parametrize("configured", [False, True])
def test_index_matches_what_pip_reports(tmp_path: Path, configured: bool) -> None:
    env = base_env(tmp_path, PIP_CONFIG_FILE=os.devnull)
    if configured:
        env["PIP_CONFIG_FILE"] = str(write_conf(tmp_path))
    cfg = load_pip_config(env)
    assert cfg.index_url == pip_reported_index(env)
    if not configured:
        from pip._internal.models.index import PyPI
        assert cfg.index_url == PyPI.simple_url
        assert cfg.index_urls == (cfg.index_url,) and cfg.find_links == ()


def test_fallback_parser_agrees_with_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = base_env(tmp_path, PIP_EXTRA_INDEX_URL="http://127.0.0.1:16/simple", PIP_RETRIES="1")
    legacy = tmp_path / "home" / ".pip" / "pip.conf"
    legacy.parent.mkdir(parents=True)
    legacy.write_text("[global]\nindex-url = http://127.0.0.1:17/simple\ntimeout = 4\n")
    user = tmp_path / "home" / ".config" / "pip" / "pip.conf"
    user.parent.mkdir(parents=True)
    user.write_text("[install]\nfind-links = /user/links\n[global]\ntimeout = 5\n")
    with_pip = load_pip_config(env)
    hide_pip(monkeypatch)
    assert load_pip_config(env) == with_pip
    assert with_pip.index_url == "http://127.0.0.1:17/simple" and with_pip.timeout == 5.0
    assert with_pip.find_links == ("/user/links",) and with_pip.retries == 1


def test_without_pip_an_index_must_be_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hide_pip(monkeypatch)
    with pytest.raises(BadInput) as err:
        load_pip_config(base_env(tmp_path, PIP_CONFIG_FILE=os.devnull))
    assert err.value.exit_code == 2
    assert "PIP_INDEX_URL" in err.value.render()
    cfg = load_pip_config(base_env(tmp_path, PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="file:///srv/i"))
    assert cfg.index_url == "file:///srv/i"
    cfg = load_pip_config(base_env(tmp_path, PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
                                   PIP_FIND_LINKS="/srv/w"))
    assert cfg.index_urls == () and cfg.find_links == ("/srv/w",)


@pytest.mark.parametrize("var,value", [("PIP_NO_INDEX", "maybe"), ("PIP_DEFAULT_TIMEOUT", "soon"),
                                       ("PIP_RETRIES", "1.5")])
def test_invalid_values_are_bad_input(tmp_path: Path, var: str, value: str) -> None:
    with pytest.raises(BadInput) as err:
        load_pip_config(base_env(tmp_path, PIP_CONFIG_FILE=os.devnull, **{var: value}))
    assert var in err.value.render() and repr(value) in err.value.render()
