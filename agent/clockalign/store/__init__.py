"""clockalign.store"""
