"""Readers' view of a run file's metadata entries (no bcc, no root: store/ layer).

    target_label(run.meta["targets"][0])   # 'pid 1 in its namespace, container docker 3f3f..'
"""


def target_label(t: dict) -> str:
    """One line for a target entry of the run file's meta: '' on the host itself."""
    bits = []
    if isinstance(t.get("nspid"), int) and t.get("nspid") != t.get("pid"):
        bits.append(f"pid {t['nspid']} in its namespace")
    c = t.get("container") if isinstance(t.get("container"), dict) else {}
    if c.get("id"):
        bits.append(f"container {c.get('runtime') or ''} {str(c['id'])[:12]}".replace("  ", " "))
    if c.get("pod"):
        bits.append(f"pod {c['pod']}")
    if t.get("cgroup") not in (None, "", "/"):
        bits.append(f"cgroup {t['cgroup']}")
    return ", ".join(bits)
