"""cairn.coordinator"""
