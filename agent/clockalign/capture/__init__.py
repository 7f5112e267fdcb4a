"""clockalign.capture"""
