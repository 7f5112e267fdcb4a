"""clockalign.timeline"""
