"""Leaf utilities every layer uses: errors, the environment reader, ids, the clock,
counted drops and tallies."""
