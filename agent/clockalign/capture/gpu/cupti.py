"""Find a CUPTI (headers + libcupti of one install) and build the injection library for it.

Looked for, first found wins:
  1. $CLOCKALIGN_CUPTI: a directory with include/cupti.h and lib/ or lib64/libcupti.so*
  2. the nvidia-cuda-cupti wheel in this Python's site-packages (nvidia/cu13 for CUDA 13,
     nvidia/cuda_cupti for CUDA 12), with cuda.h from nvidia-cuda-runtime beside it
  3. a CUDA toolkit: /usr/local/cuda*/extras/CUPTI or /usr/local/cuda*/{include,lib64}
cuda.h (and crt/host_defines.h) may come from any of these, or /usr/include.

    inst = find_cupti()                 # Cupti(include, lib, where) or CuptiMissing
    so = injection_library(inst)        # path for CUDA_INJECTION64_PATH, built at install

The injection library is built by installing (native/build.py calls build_injection against
the CUPTI found then), named by the digest of its sources and of the CUPTI headers it was
built against; injection_library finds that build, and compiles nothing.
"""
import dataclasses
import glob
import os
import site
import sys

from ...errors import ClockalignError
from ... import native
from ...native.build import build

SOURCES = ["ca_cupti.c", "ca_gpu_wire.h"]
FLAGS = dict(libs=["dl", "pthread"], cflags=["-fvisibility=hidden"])


class CuptiMissing(ClockalignError):
    """No usable CUPTI on this host (one sentence)."""


@dataclasses.dataclass
class Cupti:
    include: str            # holds cupti.h
    lib: str                # libcupti.so* of the same install
    where: str              # how it was found
    extra_includes: tuple = ()   # cuda.h, crt/host_defines.h


def _site_dirs() -> list:
    dirs = list(sys.path)
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:
        pass
    return [d for d in dict.fromkeys(dirs) if d and os.path.isdir(d)]


def _lib_in(d):
    for pat in ("libcupti.so", "libcupti.so.*"):
        hits = sorted(glob.glob(os.path.join(d, pat)))
        if hits:
            return hits[0]
    return None


def _candidates(env):
    root = env.get("CLOCKALIGN_CUPTI")
    if root:
        yield (os.path.join(root, "include"),
               [os.path.join(root, "lib"), os.path.join(root, "lib64")], "$CLOCKALIGN_CUPTI")
    for d in _site_dirs():
        for pkg in ("nvidia/cu13", "nvidia/cuda_cupti"):
            base = os.path.join(d, pkg)
            yield (os.path.join(base, "include"), [os.path.join(base, "lib")],
                   f"the Python package {pkg.replace('/', '.')} in {d}")
    for tk in sorted(glob.glob("/usr/local/cuda*"), reverse=True):
        yield (os.path.join(tk, "extras/CUPTI/include"),
               [os.path.join(tk, "extras/CUPTI/lib64")], f"the CUDA toolkit {tk}")
        yield (os.path.join(tk, "include"), [os.path.join(tk, "lib64"),
                                             os.path.join(tk, "targets/x86_64-linux/lib")],
               f"the CUDA toolkit {tk}")


def _header_dirs(name: str, first: str) -> list:
    """Directories that hold ``name`` (cuda.h, crt/host_defines.h), ``first``'s first."""
    found = []
    cands = [first] + [os.path.join(d, p, "include") for d in _site_dirs()
                       for p in ("nvidia/cu13", "nvidia/cuda_runtime", "nvidia/cuda_nvcc",
                                 "nvidia/cuda_crt")]
    cands += sorted(glob.glob("/usr/local/cuda*/include"), reverse=True)
    cands += sorted(glob.glob("/usr/local/cuda*/targets/x86_64-linux/include"), reverse=True)
    cands.append("/usr/include")
    for c in cands:
        if os.path.isfile(os.path.join(c, name)):
            found.append(c)
    return found


def find_cupti(env=None) -> Cupti:
    env = os.environ if env is None else env
    seen_headers = None
    for inc, libdirs, where in _candidates(env):
        if not os.path.isfile(os.path.join(inc, "cupti.h")):
            continue
        seen_headers = seen_headers or where
        lib = next((x for x in map(_lib_in, libdirs) if x), None)
        if not lib:
            continue
        extra = []
        for h in ("cuda.h", "crt/host_defines.h"):
            dirs = _header_dirs(h, inc)
            if not dirs:
                raise CuptiMissing(
                    f"CUPTI was found ({where}) but not {h}, which its headers include: "
                    "install the CUDA toolkit headers or pip install nvidia-cuda-runtime "
                    "nvidia-cuda-crt")
            if dirs[0] != inc:
                extra.append(dirs[0])
        return Cupti(include=inc, lib=lib, where=where, extra_includes=tuple(dict.fromkeys(extra)))
    if seen_headers:
        raise CuptiMissing(f"CUPTI headers were found ({seen_headers}) but no libcupti.so "
                           "beside them")
    raise CuptiMissing("no CUPTI found (no nvidia-cuda-cupti Python package, no "
                       "/usr/local/cuda*/extras/CUPTI, no $CLOCKALIGN_CUPTI): pip install "
                       "nvidia-cuda-cupti nvidia-cuda-runtime nvidia-cuda-crt, or set "
                       "CLOCKALIGN_CUPTI to a directory with include/ and lib/")


def _header_key(inst: Cupti) -> bytes:
    """What the injection library's build depends on besides its sources: the CUPTI headers
    (record layouts differ between versions) and cuda.h, by content, so that an install
    whose include directory is a link to another's has the same build."""
    parts = []
    for d in (inst.include, *inst.extra_includes):
        for p in sorted(glob.glob(os.path.join(d, "cupti*.h")) + [os.path.join(d, "cuda.h")]):
            if os.path.isfile(p):
                with open(p, "rb") as f:
                    parts.append(os.path.basename(p).encode() + b"\0" + f.read())
    return b"".join(parts)


def _build_args(inst: Cupti) -> dict:
    return dict(include_dirs=[inst.include, *inst.extra_includes], **FLAGS)


def _key(inst: Cupti) -> bytes:
    """The digest key native/build.py gives a build keyed by the headers (no -I paths)."""
    flags = FLAGS["cflags"] + [f"-l{lib}" for lib in FLAGS["libs"]]
    return _header_key(inst) + " ".join(flags).encode()


def build_injection(inst: Cupti, into=None) -> str:
    """Compile the injection library against ``inst``'s headers (installing runs this:
    native/build.py); CuptiMissing with the reason when it cannot be built."""
    try:
        return build("ca_cupti", SOURCES, into=into or native.BUILT, key=_header_key(inst),
                     **_build_args(inst))
    except OSError as e:
        raise CuptiMissing(f"the CUPTI injection library cannot be built against {inst.where} "
                           f"({e})") from None


def injection_library(inst: Cupti) -> str:
    """The injection library built for ``inst`` when clockalign was installed; CuptiMissing
    saying what to run where there is none (another CUPTI than the one found then)."""
    path = native.built_path("ca_cupti", SOURCES, _key(inst))
    if not path.is_file():
        raise CuptiMissing(f"the CUPTI injection library is not built for {inst.where}: "
                           "run scripts/setup.sh, or sudo python3 -m clockalign.native.build "
                           "with the same CLOCKALIGN_CUPTI")
    return str(path)
