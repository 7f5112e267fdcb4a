"""clockalign.align"""
