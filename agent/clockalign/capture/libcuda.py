"""Find the libcuda a process uses, or the one it will load.

A process that already loaded libcuda shows it in /proc/PID/maps.  One that has not (yet:
it will after ``import torch``), and every spawned command, gets the library its dynamic
loader would pick for ``dlopen("libcuda.so.1")``: its LD_LIBRARY_PATH, then the ldconfig
cache, then the default directories.  Uprobes attach to the file, so a late dlopen of the
same file is traced from its first call.

    path, how = resolve_for_pid(1234)     # ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.1", "maps")
"""
import os
import subprocess

SONAME = "libcuda.so.1"
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
                "/lib", "/usr/lib", "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib")


def loaded_libcuda(pid: int):
    """Path of libcuda mapped into pid, or None."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    if os.path.basename(path).startswith("libcuda.so"):
                        root_path = f"/proc/{pid}/root{path}"
                        return path if os.path.exists(path) else root_path
    except OSError:
        return None
    return None


def ldconfig_cache():
    """{soname: path} for x86-64 entries of the ldconfig cache."""
    out = {}
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            text = subprocess.run([exe, "-p"], capture_output=True, text=True,
                                  timeout=10).stdout
            break
        except (OSError, subprocess.TimeoutExpired):
            text = ""
    for line in text.splitlines():
        if "=>" not in line:
            continue
        left, path = line.split("=>", 1)
        name = left.strip().split()[0]
        if "x86-64" in left or "64bit" in left or "(libc6)" not in left:
            out.setdefault(name, path.strip())
    return out


def resolve_like_loader(env: dict):
    """(path, how) of the libcuda a dlopen("libcuda.so.1") would load with env, or (None, None)."""
    for d in (env.get("LD_LIBRARY_PATH") or "").split(":"):
        if d and os.path.exists(os.path.join(d, SONAME)):
            return os.path.realpath(os.path.join(d, SONAME)), "LD_LIBRARY_PATH"
    cached = ldconfig_cache().get(SONAME)
    if cached and os.path.exists(cached):
        return os.path.realpath(cached), "ldconfig cache"
    for d in DEFAULT_DIRS:
        p = os.path.join(d, SONAME)
        if os.path.exists(p):
            return os.path.realpath(p), "default library path"
    return None, None


def process_environ(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def resolve_for_pid(pid: int):
    """(path, how): 'maps' when already loaded, else how the loader would find it."""
    path = loaded_libcuda(pid)
    if path:
        return path, "maps"
    return resolve_like_loader(process_environ(pid))
