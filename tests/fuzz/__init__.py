"""Hypothesis fuzzing of key derivation, planted lock values and settings."""
