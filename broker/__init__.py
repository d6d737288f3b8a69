"""cairn.broker"""
