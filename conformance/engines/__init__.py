"""Engines under test behind one interface; each runs in a child process (see worker.py)."""
