"""The runbook: its typed model and words (durations, gate expressions, what a matrix expands to), and
reading, checking and planning it (loader, matrix, schema, cells, placement, planner, plan summary).
"""
