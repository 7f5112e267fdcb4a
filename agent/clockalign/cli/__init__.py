"""clockalign.cli"""
