"""clockalign.export"""
