"""What DSPy calls: the Metric and its Score, translation, measurement, gepa(), and hooks.py (private API)."""
