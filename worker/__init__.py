"""cairn.worker"""
