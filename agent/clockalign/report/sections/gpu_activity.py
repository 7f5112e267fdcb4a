"""GPU activity (record --gpu-activity): report/gpu_activity.py as a section; None without it."""
from ..gpu_activity import FIELDS, gpu_section
from . import Section


def build(ctx):
    sec = gpu_section(ctx.tl.gpu_activity(fields=FIELDS), ctx.data.sched)
    if not sec:
        return None
    return Section("GPU activity", sec["text"], sec["markdown"], {"gpu_activity": sec["numbers"]})
