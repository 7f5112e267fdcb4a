"""clockalign.faults"""
