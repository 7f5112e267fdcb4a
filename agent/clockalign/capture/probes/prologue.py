"""Where a function's entry probe goes: on the first instruction the kernel can run inside
its trap.

A uprobe replaces the probed instruction with int3.  When it fires, Linux emulates a probed
push, jmp, call, conditional jump or nop in the trap itself (arch/x86/kernel/uprobes.c); any
other instruction is copied to a slot out of line and single-stepped there, a second trap on
every call.  Code built with -fcf-protection starts each exported function with endbr64,
which is not emulated; the instruction after it usually is (push %rbp, push %r15, ...).
endbr64 changes no register and no memory, so a probe on the next instruction sees the same
arguments and the same return address at the stack pointer as one on the first: entry and
return probes go there.

Only prefixes known here are decoded (endbr64, push, the usual first instructions of a
compiled function); anything else is described by its bytes and probed where it starts.
"""

ENDBR64 = b"\xf3\x0f\x1e\xfa"


def first_instruction(code: bytes) -> tuple[str, bool]:
    """(a short description, emulated by the kernel's uprobe trap) of code's first
    instruction; unknown opcodes count as single-stepped, which is what they cost."""
    if code.startswith(ENDBR64):
        return "endbr64", False
    b0 = code[0] if code else None
    if b0 is None:
        return "?", False
    if 0x50 <= b0 <= 0x57:
        return f"push {_REG[b0 - 0x50]}", True
    if b0 == 0x41 and len(code) > 1 and 0x50 <= code[1] <= 0x57:
        return f"push %r{8 + code[1] - 0x50}", True
    if b0 in (0xe9, 0xeb):
        return "jmp", True
    if b0 == 0xe8:
        return "call", True
    if 0x70 <= b0 <= 0x7f or (b0 == 0x0f and len(code) > 1 and 0x80 <= code[1] <= 0x8f):
        return "jcc", True
    if b0 == 0x90:
        return "nop", True
    name = _SINGLE.get(bytes(code[:3])) or _SINGLE.get(bytes(code[:2])) or _SINGLE.get(bytes(code[:1]))
    return name or "bytes " + code[:4].hex(" "), False


def entry_skip(code: bytes) -> int:
    """Bytes to move a function's probes past its first instruction: 4 past an endbr64 that
    an emulated instruction follows, else 0."""
    if code.startswith(ENDBR64) and first_instruction(code[4:])[1]:
        return len(ENDBR64)
    return 0


def read_code(path: str, offset: int, n: int = 16) -> bytes:
    """n bytes of the file at a uprobe's file offset."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


_REG = ["%rax", "%rcx", "%rdx", "%rbx", "%rsp", "%rbp", "%rsi", "%rdi"]
_SINGLE = {b"\x48\x89": "mov (64-bit)", b"\x48\x8b": "mov (64-bit)", b"\x89": "mov",
           b"\x8b": "mov", b"\x48\x83\xec": "sub $imm8,%rsp", b"\x48\x81\xec": "sub $imm32,%rsp",
           b"\x48\x83": "add/sub/cmp (64-bit)", b"\x83": "add/sub/cmp", b"\x85": "test",
           b"\x48\x85": "test (64-bit)", b"\x31": "xor", b"\x48\x8d": "lea (64-bit)",
           b"\x39": "cmp", b"\x48\x39": "cmp (64-bit)", b"\xb8": "mov $imm32,%eax",
           b"\x0f\x1f": "nopl (multi-byte nop)", b"\x66\x0f\x1f": "nopw (multi-byte nop)",
           b"\xf3\x0f": "rep-prefixed 0f"}
