"""Checkpoint writers for quantized formats, written from the format specs, with their round trips."""
