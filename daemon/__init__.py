"""cairn.daemon"""
