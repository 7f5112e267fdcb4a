"""clockalign.report"""
