"""The PEP 751 pylock.toml reader (hermetic.locks.pylock), through read_lock."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.tags import Tag

from hermetic.locks.types import LockedWheel
from tests.support.locks import H1, H2, H3, T1, T2, T3, TAGS, WIN_ENV, WIN_TAGS, fails, line_of, read

# --- pylock.toml: accepted -------------------------------------------------------------------------------

ALPHA_BINARY = ('{ name = "alpha_pkg-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", '
                'url = "https://example.org/a/x.whl", size = 1234, upload-time = 2025-03-01T12:00:00Z, '
                f'hashes = {{ sha256 = "{H2}", sha512 = "x" }} }}')
FULL = f"""
    lock-version = "1.0"
    created-by = "hand"
    requires-python = ">=3.10"
    environments = ["sys_platform == 'win32'", "sys_platform == 'linux'"]
    extras = ["cli"]
    dependency-groups = ["dev"]
    default-groups = ["dev"]

    [[packages]]
    name = "Alpha_Pkg"
    version = "1.0"
    index = "https://example.org/simple/"
    requires-python = ">=3.8"
    wheels = [
        {{ url = "https://example.org/a/alpha_pkg-1.0-py3-none-any.whl", hashes = {{ sha256 = "{H1}" }} }},
        {ALPHA_BINARY},
    ]
    [[packages.dependencies]]
    name = "beta"
    [[packages.attestation-identities]]
    kind = "GitHub"
    repository = "o/r"
    [packages.tool.uv]
    anything = true

    [[packages]]
    name = "beta"
    version = "2"
    sdist = {{ url = "https://example.org/b/beta-2.tar.gz", hashes = {{ sha256 = "{H1}" }} }}
    [[packages.wheels]]
    path = "../wheels/beta-2-py3-none-any.whl"
    [packages.wheels.hashes]
    sha256 = "{H3.upper()}"

    [[packages]]
    name = "gamma"
    marker = "sys_platform == 'win32'"
    vcs = {{ type = "git", url = "https://x/g.git", commit-id = "abc" }}

    [[packages]]
    name = "delta"
    marker = "'dev' in dependency_groups and 'cli' not in extras"
    wheels = [{{ url = "file:///srv/delta-0.1-py3-none-any.whl", hashes = {{ sha256 = "{H1}" }} }}]

    [tool.pdm]
    whatever = [1, 2]
"""


def test_pylock_full_featured(tmp_path: Path) -> None:
    lock = read(tmp_path, FULL, name="locks/pylock.toml")
    assert lock.format == "pylock" and lock.warnings == ()
    where = str(tmp_path / "locks/pylock.toml")
    assert lock.wheels == (
        LockedWheel("alpha-pkg", "1.0", (H2,), "alpha_pkg-1.0-cp311-cp311-manylinux_2_17_x86_64.whl",
                    "https://example.org/a/x.whl", None, 1234, f"{where}:16: key packages[0].wheels[1]",
                    "https://example.org/simple/"),
        LockedWheel("beta", "2", (H3,), "beta-2-py3-none-any.whl", None,
                    tmp_path / "wheels/beta-2-py3-none-any.whl", None,
                    f"{where}:30: key packages[1].wheels[0]"),
        LockedWheel("delta", "0.1", (H1,), "delta-0.1-py3-none-any.whl", None,
                    Path("/srv/delta-0.1-py3-none-any.whl"), None, f"{where}:43: key packages[3].wheels[0]"),
    )


def test_pylock_names_and_newer_minor_version(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    text = f"""
        lock-version = "1.3"
        created-by = "future"
        new-top-key = 1
        [[packages]]
        name = "a"
        wheels = [{{ url = "https://x/a-1-py3-none-any.whl", hashes = {{ sha256 = "{H1}" }}, mirror = "m" }}]
        """
    lock = read(tmp_path, text, name="pylock.dev.toml")
    assert [w.version for w in lock.wheels] == ["1"]
    assert len(lock.warnings) == 2 and "new-top-key" in lock.warnings[0] and "mirror" in lock.warnings[1]
    assert caplog.records == []  # not packaging's own "minor version 1.3 is not supported" on stderr too
    empty = read(tmp_path, 'lock-version = "1.0"\ncreated-by = "x"\npackages = []\n', name="pylock.toml")
    assert empty.wheels == ()


@pytest.mark.parametrize("name", ["pylock..toml", "pylock.a.b.toml"])
def test_pylock_bad_file_names(tmp_path: Path, name: str) -> None:
    err = fails(tmp_path, 'lock-version = "1.0"\ncreated-by = "x"\npackages = []\n', name=name)
    assert "file name" in err.what and "pylock.NAME.toml" in (err.hint or "")


def test_pylock_best_tag_wins_and_markers_pick_platform(tmp_path: Path) -> None:
    text = f"""
        lock-version = "1.0"
        created-by = "x"
        [[packages]]
        name = "g"
        version = "3.0"
        wheels = [
            {{ url = "https://x/g-3.0-cp311-cp311-win_amd64.whl", hashes = {T1} }},
            {{ url = "https://x/g-3.0-py3-none-any.whl", hashes = {T2} }},
            {{ url = "https://x/g-3.0-cp311-abi3-manylinux_2_17_x86_64.whl", hashes = {T3} }},
        ]
        """
    assert read(tmp_path, text, name="pylock.toml").wheels[0].hashes == (H3,)
    win = read(tmp_path, text, name="pylock.toml", environment=WIN_ENV, tags=WIN_TAGS)
    assert win.wheels[0].filename == "g-3.0-cp311-cp311-win_amd64.whl"


def test_pylock_torch_style_local_version_urls(tmp_path: Path) -> None:
    # packaging 26.2 read the file name from such a URL without decoding %2B, and refused the lock
    url = "https://download.pytorch.org/whl/cu130/torch-2.14.1%2Bcu130-cp311-cp311-manylinux_2_28_x86_64.whl"
    text = f"""
        lock-version = "1.0"
        created-by = "x"
        [[packages]]
        name = "torch"
        version = "2.14.1+cu130"
        wheels = [{{ url = "{url}", hashes = {T1} }}]
        """
    tags = [Tag("cp311", "cp311", "manylinux_2_28_x86_64"), *TAGS]
    (wheel,) = read(tmp_path, text, name="pylock.toml", tags=tags).wheels
    assert (wheel.filename, wheel.version, wheel.url) == (
        "torch-2.14.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "2.14.1+cu130", url)


# --- pylock.toml: rejected -------------------------------------------------------------------------------

HEAD = 'lock-version = "1.0"\ncreated-by = "t"\n'
ONE_WHEEL = f'wheels = [{{ url = "https://x/a-1.0-py3-none-any.whl", hashes = {T1} }}]\n'
WHEEL = f'url = "https://x/a-1.0-py3-none-any.whl"\nhashes = {{ sha256 = "{H1}" }}\n'


@pytest.mark.parametrize("body, line, words", [
    ('created-by = "t"\npackages = []\n', None, "missing required key 'lock-version'"),
    ('lock-version = "2.0"\ncreated-by = "t"\npackages = []\n', 1, "unsupported lock-version"),
    ('lock-version = 1.0\ncreated-by = "t"\npackages = []\n', 1, "must be a string, found a float"),
    ('lock-version = "1.0"\npackages = []\n', None, "missing required key 'created-by'"),
    (HEAD, None, "missing required key 'packages'"),
    (HEAD + 'packages = "none"\n', 3, "must be an array"),
    (HEAD + 'lock_version = "1.0"\npackages = []\n', 3, "unknown key 'lock_version'"),
    (HEAD + "environments = [\"sys_platform == 'win32'\"]\npackages = []\n", 3, "none of this interpreter"),
    (HEAD + 'requires-python = ">=3.12"\npackages = []\n', 3, "requires Python >=3.12"),
    (HEAD + 'requires-python = "3.12"\npackages = []\n', 3, "invalid requires-python"),
    (HEAD + "environments = [\"sys_platform ==\"]\npackages = []\n", 3, "invalid environment marker"),
    (HEAD + "packages = []\n[tool]\nx = 1\n[extra]\ny = 2\n", 6, "unknown key 'extra'"),
    (HEAD + 'extras = ["Cli"]\npackages = []\n', 3, "'Cli' is not normalized"),
])
def test_pylock_top_level_errors(tmp_path: Path, body: str, line: int | None, words: str) -> None:
    err = fails(tmp_path, body, name="pylock.toml")
    assert words in err.what, err.render()
    if line is not None:
        assert line_of(err) == line, err.where


@pytest.mark.parametrize("package, line, words", [
    ('version = "1.0"\n', 3, "missing required key 'name'"),
    ('name = "a"\nversion = "1.0"\n', 3, "exactly one source, found none"),
    ('name = "a"\nflavour = "x"\n', 5, "unknown key 'flavour'"),
    ('name = "a"\nversion = "not a version"\n', 5, "invalid version"),
    # a lock with no mistake but this one (an empty wheels list is itself one, found before any selection)
    ('name = "a"\nrequires-python = "<3"\n' + ONE_WHEEL, 5, "requires Python <3"),
    ('name = "a"\nvcs = { type = "git", url = "u", commit-id = "c" }\n', 5, "hermetic installs wheels only"),
    ('name = "a"\ndirectory = { path = "." }\n', 5, "locked as a source directory"),
    ('name = "a"\narchive = { url = "https://x/a.zip", hashes = { sha256 = "0" } }\n', 5, "as an archive"),
    (f'name = "a"\nsdist = {{ url = "https://x/a-1.tar.gz", hashes = {T1} }}\n', 5, "locked as an sdist"),
    ('name = "a"\nwheels = []\n', 5, "empty wheels list"),
    ('name = "a"\ndirectory = { path = "." }\nwheels = []\n', 3, "exactly one source"),
    ('name = "a"\nattestation-identities = [{ repository = "x" }]\nwheels = []\n', 5, "'kind'"),
    ('name = "a"\ndependencies = { b = 1 }\nwheels = []\n', 5, "must be an array, found a table"),
    ('name = "a"\nmarker = "python_version >>> \'3\'"\nwheels = []\n', 5, "invalid environment marker"),
    # what packaging's PEP 751 reader finds beyond hermetic's checks, at the line of the key it names, even in
    # a package this interpreter would not install
    ('name = "a"\nmarker = "sys_platform == \'win32\'"\nvcs = { type = "git", url = "u" }\n', 6,
     "not a valid PEP 751 lock: Missing required value"),
    ('name = "a"\nmarker = "python_version ~= \'3\'"\n' + ONE_WHEEL, 5, "cannot evaluate marker"),
])
def test_pylock_package_errors(tmp_path: Path, package: str, line: int, words: str) -> None:
    err = fails(tmp_path, HEAD + "[[packages]]\n" + package, name="pylock.toml")
    assert words in err.what, err.render()
    assert line_of(err) == line, err.where


@pytest.mark.parametrize("wheel, line, words", [
    (f'hashes = {{ sha256 = "{H1}" }}\n', 6, "neither url nor path"),
    (f'url = "x/a-1.0-py3-none-any.whl"\nhashes = {{ sha256 = "{H1}" }}\n', 7, "not an absolute URL"),
    (f'path = "https://x/a-1.0-py3-none-any.whl"\nhashes = {{ sha256 = "{H1}" }}\n', 7, "is a URL"),
    (f'url = "ftp://x/a-1.0-py3-none-any.whl"\nhashes = {{ sha256 = "{H1}" }}\n', 7, "unsupported URL"),
    ('url = "https://x/a-1.0-py3-none-any.whl"\n', 6, "missing required key 'hashes'"),
    ('url = "https://x/a-1.0-py3-none-any.whl"\nhashes = {}\n', 8, "hashes table is empty"),
    ('url = "https://x/a-1.0-py3-none-any.whl"\nhashes = "sha256:00"\n', 8, "must be a table"),
    (f'url = "https://x/a-1.0-py3-none-any.whl"\nhashes = {{ SHA256 = "{H1}" }}\n', 8, "lowercase"),
    (f'url = "https://x/a-1.0-py3-none-any.whl"\nhashes = {{ sha512 = "{"f" * 128}" }}\n', 6, "no sha256"),
    ('url = "https://x/a-1.0-py3-none-any.whl"\nhashes = { sha256 = "abc" }\n', 8, "bad sha256"),
    (WHEEL + 'size = "12"\n', 9, "must be an integer, found a string"),
    (WHEEL + "size = true\n", 9, "must be an integer, found a boolean"),
    (WHEEL + "size = -1\n", 9, "negative size"),
    (WHEEL + 'upload-time = "2025-01-01T00:00:00Z"\n', 9, "must be a date-time"),
    (WHEEL + "upload-time = 2025-01-01\n", 9, "must be a date-time, found a date"),
    (WHEEL + 'sha256 = "x"\n', 9, "unknown key 'sha256'"),
    (WHEEL + 'name = "b-1.0-py3-none-any.whl"\n', 6, "not a wheel of a 1.0"),
    (WHEEL + 'name = "a-2.0-py3-none-any.whl"\n', 6, "not a wheel of a 1.0"),
    (WHEEL + 'name = "a.whl"\n', 6, "invalid wheel file name"),
    (WHEEL + 'name = "a-1.0-cp27-cp27m-win32.whl"\n', 6, "no wheel for this interpreter"),
    (WHEEL + 'name = "a-1.0-py3-none-any\\u000b.whl"\n', 6, "control character"),
])
def test_pylock_wheel_errors(tmp_path: Path, wheel: str, line: int, words: str) -> None:
    body = HEAD + '[[packages]]\nname = "a"\nversion = "1.0"\n[[packages.wheels]]\n' + wheel
    err = fails(tmp_path, body, name="pylock.toml")
    assert words in err.what, err.render()
    assert line_of(err) == line, err.where


def test_pylock_no_compatible_wheel_lists_files(tmp_path: Path) -> None:
    err = fails(tmp_path, HEAD + f"""
        [[packages]]
        name = "a"
        wheels = [
            {{ url = "https://x/a-1-cp39-cp39-win32.whl", hashes = {{ sha256 = "{H1}" }} }},
            {{ url = "https://x/a-1-cp312-cp312-macosx_11_0_arm64.whl", hashes = {{ sha256 = "{H1}" }} }},
        ]
        """, name="pylock.toml")
    assert "a-1-cp39-cp39-win32.whl, a-1-cp312-cp312-macosx_11_0_arm64.whl" in err.what
    assert "cp311-cp311-manylinux_2_17_x86_64" in (err.hint or "") and line_of(err) == 6


def test_pylock_same_package_twice(tmp_path: Path) -> None:
    entry = f'[[packages]]\nname = "A"\nwheels = [{{ url = "https://x/a-1-py3-none-any.whl", ' \
            f'hashes = {{ sha256 = "{H1}" }} }}]\n'
    err = fails(tmp_path, HEAD + entry + entry.replace('"A"', '"a"'), name="pylock.toml")
    assert "locked twice" in err.what and line_of(err) == 6 and "pylock.toml:5" in err.what
    skipped = entry.replace('name = "A"', "name = \"a\"\nmarker = \"sys_platform == 'win32'\"")
    assert len(read(tmp_path, HEAD + entry + skipped, name="pylock.toml").wheels) == 1
