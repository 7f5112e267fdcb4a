"""The BPF C of the per-function CUDA probes, generated from store/cuda_api.py.

Each traced function gets ``enter_<symbol>`` (uprobe: reads the table's arguments and calls
a helper of bpf/probes.c: cuda_enter, launch_enter, launch_ex_enter, memcpy2d_enter,
memcpy3d_enter) and ``return_<symbol>`` (uretprobe: cuda_return, or cuda_return_str where
the function keeps a string).  cflags.bpf_text() appends this to probes.c.

    print(c_text())          # what --dump-bpf shows after probes.c
"""
from ...store import cuda_api


def param(n: int) -> str:
    """C expression of parameter n (1-based) at a function's first instruction (x86-64)."""
    return f"PT_REGS_PARM{n}(ctx)" if n <= 6 else f"stack_arg(ctx, {n})"


def read_expr(r: cuda_api.Read) -> str:
    if r.how == "arg" and r.size < 8:
        return f"(u{8 * r.size}){param(r.param)}"
    if r.how in ("arg", "out", "string"):
        return param(r.param)
    if r.how == "field":
        fn = {4: "user_u32", 8: "user_u64"}[r.size]
        return f"{fn}({param(r.param)}, {r.offset})"
    raise ValueError(f"no C expression for {r}")


def enter_body(f: cuda_api.CudaFunction) -> str:
    if f.entry == "launch":
        return f"launch_enter(ctx, {f.id})"
    if f.entry == "launch_ex":
        return f"launch_ex_enter(ctx, {f.id})"
    if f.entry in ("memcpy2d", "memcpy3d"):
        s = f.slot("stream")
        r = f.args[s][1]
        stream = read_expr(r) if r.how != "helper" else "0"
        return f"{f.entry}_enter(ctx, {f.id}, {stream})"
    vals = [read_expr(r) for _, r in f.args] + ["0"] * (5 - len(f.args))
    return f"cuda_enter({f.id}, {', '.join(vals)})"


def return_body(f: cuda_api.CudaFunction) -> str:
    deref = int(f.deref_a0)
    if f.string_slot is not None:
        return f"cuda_return_str(ctx, {f.id}, {deref}, {f.string_slot})"
    return f"cuda_return(ctx, {f.id}, {deref})"


def cookie(f: cuda_api.CudaFunction) -> int:
    """What the uprobe_multi link tells return_any about f: id | deref_a0 << 16 |
    (string slot + 1) << 24 (bpf/probes.c decodes it the same way)."""
    slot = -1 if f.string_slot is None else f.string_slot
    return f.id | int(f.deref_a0) << 16 | (slot + 1) << 24


def c_text(functions=None) -> str:
    """Per function enter_X/return_X (attached one by one, where uprobe_multi links are not
    available), then enter_any/return_any: one program each for all functions, which
    tell them apart by the link's cookie (capture/probes/uprobe_multi.py)."""
    functions = sorted(cuda_api.FUNCTIONS.values() if functions is None else functions,
                       key=lambda f: f.id)
    lines = ["", "/* ---------------------------------------------------------------- "
             "generated from clockalign/store/cuda_api.py */", "#ifdef CA_CUDA"]
    for f in functions:
        what = ", ".join(f"{n}={r.describe()}" for n, r in f.args).replace("*/", "* /")
        lines.append(f"/* {f.id} {f.symbol}: {f.role}; {what} */")
        lines.append(f"int enter_{f.symbol}(struct pt_regs *ctx) {{ return {enter_body(f)}; }}")
        lines.append(f"int return_{f.symbol}(struct pt_regs *ctx) {{ return {return_body(f)}; }}")
    lines += ["", "int enter_any(struct pt_regs *ctx)", "{",
              "    switch (bpf_get_attach_cookie(ctx) & 0xffff) {"]
    for f in functions:
        lines.append(f"    case {f.id}: return {enter_body(f)};")
    lines += ["    }", "    return 0;", "}", "",
              "int return_any(struct pt_regs *ctx)", "{",
              "    u64 c = bpf_get_attach_cookie(ctx);",
              "    return cuda_return_str(ctx, c & 0xffff, (c >> 16) & 1, (int)((c >> 24) & 0xff) - 1);",
              "}", "#endif /* CA_CUDA */"]
    return "\n".join(lines) + "\n"
