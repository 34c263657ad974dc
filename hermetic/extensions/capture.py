"""The capture of a package's setup.py, run by ``hermetic recipe new`` (extensions/derive.py) in the recipe's
interpreter, inside the sandbox, in a scratch copy of the sdist under the root: nothing compiles.

It imports nothing from hermetic (it runs in the package's interpreter with only torch and setuptools). It
replaces torch's CUDAExtension / CppExtension (calling the real ones, recording what they were given and
added), BuildExtension (whose run() refuses), ``setuptools.setup`` (recording its arguments and the package's
files), records every environment read and every torch.cuda question asked from setup.py's own lines (a GPU
is pretended with ``--gpu pretend``), refuses downloads, traces the lines that ran, then runs setup.py as
``__main__`` and writes the raw record as JSON. derive.py turns it into a recipe.

    python capture.py TREE --gpu pretend|none --archs 9.0 --argv bdist_wheel
"""

# mypy: ignore-errors
# (it patches torch and setuptools at run time: the objects it touches have no types worth checking)

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys

RESULT = "hermetic-capture-result: "


def child_main(tree: str, cuda_home: str | None, gpu: str, archs: str, argv: list[str]) -> int:
    import runpy
    import threading
    import traceback

    tree = os.path.realpath(tree)
    setup_py = os.path.join(tree, "setup.py")
    rec: dict = {"setup_py": setup_py, "env_reads": [], "probes": [], "subprocesses": [], "network": [],
                 "extensions": [], "setup_calls": [], "shims": [], "build_ext_options": [], "errors": [],
                 "executed_lines": []}
    executed: set[int] = set()

    def setup_frames(skip: int = 2) -> list[dict]:
        """setup.py's frames on the stack, outermost first: line, function, the line's text."""
        f = sys._getframe(skip)
        frames = []
        while f is not None:
            if f.f_code.co_filename == setup_py:
                frames.append({"line": f.f_lineno, "function": f.f_code.co_name})
            f = f.f_back
        return frames[::-1]

    def direct(skip: int = 2) -> bool:
        """Was the caller (skip frames up) setup.py's own code, or something it called (torch, setuptools)?"""
        return sys._getframe(skip).f_code.co_filename == setup_py

    # -- environment reads: os.environ's class is swapped, so `from os import environ`, os.getenv,
    #    os.environ.get / [] / in all go through it (os.getenv calls environ.get)
    Environ = type(os.environ)

    class RecordingEnviron(Environ):  # type: ignore[misc, valid-type]
        def _note(self, how, key, default=None, skip=3):
            frames = setup_frames(skip)
            if not frames or in_fake_setup:
                return  # torch's or setuptools' own reads, not asked for by setup.py
            try:
                value = Environ.__getitem__(self, key)
            except KeyError:
                value = None
            f = sys._getframe(2)
            while f is not None and os.path.basename(f.f_code.co_filename) in ("os.py", "_collections_abc.py",
                                                                           "<frozen os>", "<frozen _collections_abc>"):
                f = f.f_back
            rec["env_reads"].append({"key": key, "how": how, "value": value, "default": default,
                                     "direct": f is not None and f.f_code.co_filename == setup_py,
                                     "frames": frames})

        def get(self, key, default=None):
            self._note("get", key, default)
            return Environ.get(self, key, default)

        def __getitem__(self, key):
            if sys._getframe(1).f_code.co_name not in ("get", "__contains__"):  # Mapping's call [] themselves
                self._note("[]", key)
            return Environ.__getitem__(self, key)

        def __contains__(self, key):
            self._note("in", key)
            return Environ.__contains__(self, key)

    in_fake_setup = False  # the capture's own Distribution reads HOME, PLAT ...: not setup.py's
    os.environ.__class__ = RecordingEnviron

    if cuda_home is not None and os.environ.get("CUDA_HOME") != cuda_home:
        print("capture: CUDA_HOME not passed through", file=sys.stderr)
        return 3

    # -- torch: CUDA_HOME is computed when torch.utils.cpp_extension is first imported
    import sysconfig

    import torch
    import torch.utils.cpp_extension as ce
    rec["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
                    "dir": os.path.dirname(torch.__file__), "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
                    "cpp_extension_CUDA_HOME": ce.CUDA_HOME,
                    "cxx11_abi_at_import": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
                    "cuda_available_really": torch.cuda.is_available()}
    if cuda_home is None and ce.CUDA_HOME is not None:
        print(f"capture: without --cuda-home torch guessed CUDA_HOME={ce.CUDA_HOME!r} (from nvcc on PATH or "
              "/usr/local/cuda); refusing it: give hermetic's toolchain", file=sys.stderr)
        return 3
    if cuda_home is not None and (ce.CUDA_HOME is None
                                  or os.path.realpath(ce.CUDA_HOME) != os.path.realpath(cuda_home)):
        print(f"capture: torch.utils.cpp_extension.CUDA_HOME is {ce.CUDA_HOME!r}, not {cuda_home!r}",
              file=sys.stderr)
        return 3

    # -- a pretended GPU: what setup.py would see on the machine it is built for
    arch_list = [a for a in archs.replace(",", " ").split() if a]
    cap = tuple(int(x) for x in arch_list[0].split("+")[0].split(".")) if arch_list else (9, 0)

    def probe(name, answer):
        def fake(*a, **k):
            rec["probes"].append({"call": f"torch.cuda.{name}", "answer": answer,
                                  "direct": direct(), "frames": setup_frames()})
            return answer
        return fake

    real_probes = {}
    if gpu == "pretend":
        for name, answer in (("is_available", True), ("device_count", 1), ("get_device_capability", cap),
                             ("get_arch_list", [f"sm_{a.replace('.', '').split('+')[0]}" for a in arch_list]),
                             ("get_device_name", "capture (no GPU)")):
            real_probes[name] = getattr(torch.cuda, name)
            setattr(torch.cuda, name, probe(name, answer))
    else:  # only record the calls
        for name in ("is_available", "device_count", "get_device_capability"):
            real = getattr(torch.cuda, name)

            def rec_probe(*a, _n=name, _r=real, **k):
                answer = _r(*a, **k)
                rec["probes"].append({"call": f"torch.cuda.{_n}", "answer": answer, "direct": direct(),
                                      "frames": setup_frames()})
                return answer
            setattr(torch.cuda, name, rec_probe)

    # -- every setuptools/distutils Extension remembers where setup.py made it
    import setuptools
    import setuptools.extension
    from setuptools._distutils import extension as dext

    base_init = dext.Extension.__init__

    def ext_init(self, *a, **k):
        base_init(self, *a, **k)
        if not hasattr(self, "_capture"):
            self._capture = {"kind": "plain", "frames": setup_frames(), "user": None, "torch_added": {}}

    dext.Extension.__init__ = ext_init

    def snapshot(kwargs: dict) -> dict:
        out = {}
        for k, v in kwargs.items():
            try:
                out[k] = copy.deepcopy(v)
            except Exception:
                out[k] = repr(v)
        return out

    def wrap(kind, real):
        def ctor(name, sources, *args, **kwargs):
            frames = setup_frames()
            user = snapshot({"name": name, "sources": list(sources), **kwargs})
            ext = real(name, sources, *args, **kwargs)  # torch's own: its includes, libraries, CUDA_HOME check
            added = {}
            for key in ("include_dirs", "library_dirs", "libraries"):
                mine = [str(x) for x in user.get(key, [])]
                added[key] = [str(x) for x in getattr(ext, key)][len(mine):]
            ext._capture = {"kind": kind, "frames": frames, "user": user, "torch_added": added}
            return ext
        ctor.__wrapped__ = real
        return ctor

    ce.CUDAExtension = wrap("cuda", ce.CUDAExtension)
    ce.CppExtension = wrap("cpp", ce.CppExtension)
    if hasattr(ce, "SyclExtension"):
        ce.SyclExtension = wrap("sycl", ce.SyclExtension)

    # -- BuildExtension: a class setup.py can subclass and call with_options on; it never builds
    from setuptools.command.build_ext import build_ext as _build_ext

    class BuildExtension(_build_ext):
        _capture_options: dict = {}

        @classmethod
        def with_options(cls, **options):
            rec["build_ext_options"].append({"options": options, "frames": setup_frames()})

            class cls_with_options(cls):
                _capture_options = {**cls._capture_options, **options}
            return cls_with_options

        def run(self):
            raise RuntimeError("capture: BuildExtension.run called; the capture never builds")

    ce.BuildExtension = BuildExtension  # a module attribute wins over the module's lazy __getattr__

    # -- subprocesses setup.py starts (nvcc -V, git ...): recorded, allowed
    real_popen_init = subprocess.Popen.__init__

    def popen_init(self, args, *a, **k):
        frames = setup_frames()
        if frames:
            rec["subprocesses"].append({"argv": [str(x) for x in args] if isinstance(args, (list, tuple))
                                        else str(args), "frames": frames})
        real_popen_init(self, args, *a, **k)

    subprocess.Popen.__init__ = popen_init

    # -- network: refused (a capture is offline, as hermetic's sandbox would be)
    import urllib.error
    import urllib.request

    def no_net(name):
        def refuse(url, *a, **k):
            rec["network"].append({"call": name, "url": str(getattr(url, "full_url", url)),
                                   "frames": setup_frames()})
            raise urllib.error.URLError("capture: no network")
        return refuse

    urllib.request.urlopen = no_net("urllib.request.urlopen")
    urllib.request.urlretrieve = no_net("urllib.request.urlretrieve")

    # -- build requirements that are only there for commands the capture never runs: shimmed
    try:
        import wheel.bdist_wheel  # noqa: F401
    except ImportError:
        import types

        from setuptools.command import bdist_wheel as st_bdist_wheel
        w = types.ModuleType("wheel")
        w.__path__ = []  # a package
        wb = types.ModuleType("wheel.bdist_wheel")
        wb.bdist_wheel = st_bdist_wheel.bdist_wheel
        w.bdist_wheel = wb
        sys.modules.setdefault("wheel", w)
        sys.modules.setdefault("wheel.bdist_wheel", wb)
        rec["shims"].append("wheel.bdist_wheel -> setuptools.command.bdist_wheel (wheel is not installed)")

    # -- setup(): recorded; the Distribution it describes is made (setup.cfg and pyproject read too), and
    #    build_py asked which Python files and package data would be installed. Nothing is built.
    def fake_setup(**attrs):
        nonlocal in_fake_setup
        in_fake_setup = True
        try:
            return _fake_setup(attrs)
        finally:
            in_fake_setup = False

    def _fake_setup(attrs):
        call = {"frames": setup_frames(), "attrs": {}, "packages": None}
        for k, v in attrs.items():
            if k == "ext_modules":
                continue
            try:
                json.dumps(v)
                call["attrs"][k] = v
            except TypeError:
                call["attrs"][k] = {kk: repr(vv) for kk, vv in v.items()} if isinstance(v, dict) else repr(v)
        cmdclass = attrs.get("cmdclass") or {}
        call["cmdclass"] = {}
        for cmd, cls in cmdclass.items():
            own = []
            if isinstance(cls, type):  # methods of its own, above the capture's BuildExtension
                for klass in cls.__mro__:
                    if klass is BuildExtension or klass.__module__.startswith(("setuptools", "distutils")):
                        break
                    if getattr(klass, "__qualname__", "").endswith("cls_with_options"):
                        continue
                    own += [f"{klass.__qualname__}.{n}" for n in vars(klass) if not n.startswith("__")]
            call["cmdclass"][cmd] = {"class": getattr(cls, "__qualname__", repr(cls)),
                                     "module": getattr(cls, "__module__", None),
                                     "is_torch_build_ext": isinstance(cls, type) and issubclass(cls, BuildExtension),
                                     "options": dict(getattr(cls, "_capture_options", {}) or {}),
                                     "own_methods": own}
        exts = list(attrs.get("ext_modules") or [])
        call["n_ext_modules"] = len(exts)
        for ext in exts:
            rec["extensions"].append(describe_ext(ext))
        call["cxx11_abi_at_setup"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
        try:
            from setuptools.dist import Distribution
            d_attrs = {k: v for k, v in attrs.items() if k not in ("ext_modules", "cmdclass")}
            dist = Distribution(d_attrs)
            dist.script_name = "setup.py"
            dist.parse_config_files()
            bp = dist.get_command_obj("build_py")
            bp.ensure_finalized()
            modules = sorted({os.path.relpath(m[2], tree) for m in bp.find_all_modules()})
            data = []
            for package, src_dir, _build_dir, names in bp.data_files:
                for n in names:
                    data.append({"package": package, "file": os.path.relpath(os.path.join(src_dir, n), tree)})
            call["packages"] = {"packages": list(dist.packages or []), "package_dir": dict(dist.package_dir or {}),
                                "py_modules": list(dist.py_modules or []),
                                "package_data": {k: list(v) for k, v in (dist.package_data or {}).items()},
                                "exclude_package_data": {k: list(v) for k, v in
                                                         (dist.exclude_package_data or {}).items()},
                                "include_package_data": dist.include_package_data,
                                "data_files": dist.data_files, "module_files": modules, "package_data_files": data,
                                "name": dist.get_name(), "version": dist.get_version(),
                                "install_requires": list(dist.install_requires or []),
                                "python_requires": dist.python_requires}
        except Exception as e:  # the record of the extensions stands without it
            call["packages_error"] = f"{type(e).__name__}: {e}"
            rec["errors"].append(traceback.format_exc())
        rec["setup_calls"].append(call)
        return None

    setuptools.setup = fake_setup
    import setuptools._distutils.core as dcore
    dcore.setup = fake_setup
    try:
        import distutils.core
        distutils.core.setup = fake_setup
    except ImportError:
        pass

    def describe_ext(ext) -> dict:
        c = getattr(ext, "_capture", None) or {"kind": "plain", "frames": [], "user": None, "torch_added": {}}

        def strs(v):
            return [str(x) for x in (v or [])]
        eca = ext.extra_compile_args
        eca = {k: strs(v) for k, v in eca.items()} if isinstance(eca, dict) else strs(eca)
        d = {"name": ext.name, "kind": c["kind"], "frames": c["frames"],
             "sources": strs(ext.sources), "include_dirs": strs(ext.include_dirs),
             "define_macros": [[str(k), None if v is None else str(v)] for k, v in (ext.define_macros or [])],
             "undef_macros": strs(ext.undef_macros), "extra_compile_args": eca,
             "libraries": strs(ext.libraries), "library_dirs": strs(ext.library_dirs),
             "runtime_library_dirs": strs(ext.runtime_library_dirs), "extra_link_args": strs(ext.extra_link_args),
             "extra_objects": strs(ext.extra_objects), "depends": strs(ext.depends),
             "export_symbols": strs(ext.export_symbols), "language": ext.language,
             "py_limited_api": bool(getattr(ext, "py_limited_api", False)),
             "torch_added": c["torch_added"],
             "changed_after_constructor": []}
        if c["user"] is not None:  # setup.py may change an extension after making it
            for key in ("sources", "extra_compile_args", "extra_link_args", "define_macros"):
                u = c["user"].get(key, [] if key != "extra_compile_args" else [])
                u = ({k: strs(v) for k, v in u.items()} if isinstance(u, dict) else strs(u)) \
                    if key != "define_macros" else [[str(k), None if v is None else str(v)] for k, v in u]
                if u != d[key] and not (key == "extra_compile_args" and isinstance(u, dict) and
                                        {k: v for k, v in d[key].items() if k != "nvcc_dlink"} == u):
                    d["changed_after_constructor"].append(key)
        return d

    # -- which lines of setup.py ran (for the provenance of every value)
    def local_trace(frame, event, arg):
        if event == "line":
            executed.add(frame.f_lineno)
        return local_trace

    def global_trace(frame, event, arg):
        if frame.f_code.co_filename == setup_py:
            executed.add(frame.f_lineno)
            return local_trace
        return None

    sys.argv = ["setup.py", *argv]
    sys.path.insert(0, tree)
    os.chdir(tree)
    sys.settrace(global_trace)
    threading.settrace(global_trace)
    status = 0
    try:
        runpy.run_path(setup_py, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            rec["errors"].append(f"setup.py exited {e.code!r}")
            status = 1
    except BaseException:
        rec["errors"].append(traceback.format_exc())
        status = 1
    finally:
        sys.settrace(None)
        threading.settrace(None)
        for name, real in real_probes.items():
            setattr(torch.cuda, name, real)
    rec["executed_lines"] = sorted(executed)
    try:  # what setuptools' compiler gives every C++ unit (not nvcc's) and the link: this interpreter's sysconfig
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.sysconfig import customize_compiler
        cc = new_compiler()
        customize_compiler(cc)
        rec["setuptools_compiler"] = {"compiler_so_cxx": list(getattr(cc, "compiler_so_cxx", cc.compiler_so)),
                                      "linker_so": list(cc.linker_so)}
    except Exception as e:
        rec["setuptools_compiler"] = {"error": repr(e)}
    rec["argv"] = sys.argv
    # the record on the real stdout, one line after whatever setup.py printed (this file writes nothing)
    sys.__stdout__.write("\n" + RESULT + json.dumps(rec, default=repr) + "\n")
    sys.__stdout__.flush()
    return status



def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--gpu", choices=("pretend", "none"), default="pretend")
    ap.add_argument("--archs", default="9.0")
    ap.add_argument("--argv", default="bdist_wheel")
    a = ap.parse_args()
    return child_main(a.tree, os.environ.get("CUDA_HOME"), a.gpu, a.archs, a.argv.split())


if __name__ == "__main__":
    sys.exit(main())
